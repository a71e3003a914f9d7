//! [`BoxOrBits`]: one word that owns either a boxed value or up to 63 bits of plain data,
//! so that a struct keeps its common case inline and the rest behind one pointer in 8
//! bytes, with a niche (the word is never zero) for an enum around it.

use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;

/// Either a `Box<T>` (bit 0 clear: `T`'s alignment is at least 2) or `data << 1 | 1`.
pub struct BoxOrBits<T> {
    word: NonNull<T>,
    owns: PhantomData<Box<T>>,
}

// SAFETY: it owns its `T` alone, as a Box does.
unsafe impl<T: Send> Send for BoxOrBits<T> {}
// SAFETY: `&BoxOrBits<T>` gives only `&T`.
unsafe impl<T: Sync> Sync for BoxOrBits<T> {}

impl<T> BoxOrBits<T> {
    const ALIGNED: () = assert!(std::mem::align_of::<T>() >= 2 && usize::BITS == 64);

    /// `data` inline (63 bits: its top bit is dropped).
    pub fn bits(data: u64) -> Self {
        let word = std::ptr::without_provenance_mut::<T>(((data << 1) | 1) as usize);
        BoxOrBits {
            // SAFETY: bit 0 is set: never null (and never read through).
            word: unsafe { NonNull::new_unchecked(word) },
            owns: PhantomData,
        }
    }

    pub fn boxed(b: Box<T>) -> Self {
        let () = Self::ALIGNED;
        BoxOrBits {
            word: NonNull::from(Box::leak(b)),
            owns: PhantomData,
        }
    }

    fn is_boxed(&self) -> bool {
        self.word.as_ptr().addr() & 1 == 0
    }

    /// The inline data, unless it holds a box.
    pub fn get_bits(&self) -> Option<u64> {
        (!self.is_boxed()).then(|| self.word.as_ptr().addr() as u64 >> 1)
    }

    pub fn get(&self) -> Option<&T> {
        if !self.is_boxed() {
            return None;
        }
        // SAFETY: bit 0 clear: the pointer of the Box this owns, alive as long as self.
        Some(unsafe { self.word.as_ref() })
    }

    pub fn get_mut(&mut self) -> Option<&mut T> {
        if !self.is_boxed() {
            return None;
        }
        // SAFETY: as in `get`; `&mut self` is the only way to it.
        Some(unsafe { self.word.as_mut() })
    }
}

impl<T> Drop for BoxOrBits<T> {
    fn drop(&mut self) {
        if self.is_boxed() {
            // SAFETY: the Box this owns (made by `boxed`), dropped once.
            drop(unsafe { Box::from_raw(self.word.as_ptr()) });
        }
    }
}

impl<T: Clone> Clone for BoxOrBits<T> {
    fn clone(&self) -> Self {
        match self.get() {
            Some(t) => BoxOrBits::boxed(Box::new(t.clone())),
            // Inline data: the word itself.
            None => BoxOrBits {
                word: self.word,
                owns: PhantomData,
            },
        }
    }
}

impl<T: fmt::Debug> fmt::Debug for BoxOrBits<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.get(), self.get_bits()) {
            (Some(t), _) => f.debug_tuple("Boxed").field(t).finish(),
            (None, bits) => f.debug_tuple("Bits").field(&bits.unwrap_or(0)).finish(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_either_and_frees_its_box() {
        assert_eq!(std::mem::size_of::<Option<BoxOrBits<u64>>>(), 8);
        let b = BoxOrBits::<Vec<u8>>::bits(u64::MAX);
        assert_eq!(b.get_bits(), Some(u64::MAX >> 1));
        assert!(b.get().is_none());
        assert_eq!(BoxOrBits::<Vec<u8>>::bits(0).get_bits(), Some(0));
        let mut x = BoxOrBits::boxed(Box::new(vec![1u8, 2]));
        assert_eq!(x.get_bits(), None);
        if let Some(v) = x.get_mut() {
            v.push(3);
        }
        let y = x.clone();
        drop(x);
        assert_eq!(y.get().map(Vec::as_slice), Some(&[1u8, 2, 3][..]));
    }
    /// Each boxed value is dropped exactly once (by its owner or its clone), inline words
    /// drop nothing, and a value with the top bit set keeps the other 63.
    #[test]
    fn drops_each_box_once() {
        use std::rc::Rc;
        let count = Rc::new(());
        #[derive(Clone)]
        struct D(Rc<()>, u16);
        {
            let a = BoxOrBits::boxed(Box::new(D(count.clone(), 7)));
            let b = a.clone();
            let words = [BoxOrBits::<D>::bits(1 << 63 | 5), BoxOrBits::<D>::bits(0)];
            let copies = words.to_vec();
            assert_eq!(Rc::strong_count(&count), 3);
            drop(a);
            assert_eq!(b.get().map(|d| d.1), Some(7));
            assert_eq!(copies[0].get_bits(), Some(5));
            assert_eq!(copies[1].get_bits(), Some(0));
            let opt: Option<BoxOrBits<D>> = Some(b);
            assert!(opt.as_ref().is_some_and(|b| b.get().is_some()));
        }
        assert_eq!(Rc::strong_count(&count), 1);
    }
}
