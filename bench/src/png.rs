//! A small RGB canvas (rectangles, lines, 8x8 bitmap text) and a PNG encoder, enough
//! for the benchmark chart without a plotting stack.

pub type Rgb = [u8; 3];

pub struct Canvas {
    pub w: i32,
    pub h: i32,
    px: Vec<Rgb>,
}

impl Canvas {
    pub fn new(w: i32, h: i32, bg: Rgb) -> Canvas {
        Canvas {
            w,
            h,
            px: vec![bg; (w * h) as usize],
        }
    }

    pub fn set(&mut self, x: i32, y: i32, c: Rgb) {
        if x >= 0 && y >= 0 && x < self.w && y < self.h {
            self.px[(y * self.w + x) as usize] = c;
        }
    }

    pub fn rect(&mut self, x: i32, y: i32, w: i32, h: i32, c: Rgb) {
        for yy in y..y + h {
            for xx in x..x + w {
                self.set(xx, yy, c);
            }
        }
    }

    /// A line `t` pixels thick.
    pub fn line(&mut self, x0: i32, y0: i32, x1: i32, y1: i32, t: i32, c: Rgb) {
        let (dx, dy) = ((x1 - x0).abs(), -(y1 - y0).abs());
        let (sx, sy) = (if x0 < x1 { 1 } else { -1 }, if y0 < y1 { 1 } else { -1 });
        let (mut x, mut y, mut err) = (x0, y0, dx + dy);
        loop {
            self.rect(x - t / 2, y - t / 2, t, t, c);
            if x == x1 && y == y1 {
                break;
            }
            let e2 = 2 * err;
            if e2 >= dy {
                err += dy;
                x += sx;
            }
            if e2 <= dx {
                err += dx;
                y += sy;
            }
        }
    }

    /// A horizontal dashed line.
    pub fn dashed(&mut self, x0: i32, x1: i32, y: i32, c: Rgb) {
        let mut x = x0;
        while x < x1 {
            self.rect(x, y, 6.min(x1 - x), 2, c);
            x += 10;
        }
    }

    pub fn text_width(s: &str, scale: i32) -> i32 {
        s.chars().count() as i32 * 8 * scale
    }

    /// Text with its top-left corner at (x, y); ASCII only (others print as '?').
    pub fn text(&mut self, x: i32, y: i32, s: &str, c: Rgb, scale: i32) {
        for (i, ch) in s.chars().enumerate() {
            let code = if ch.is_ascii() {
                ch as usize
            } else {
                '?' as usize
            };
            let glyph = font8x8::legacy::BASIC_LEGACY[code];
            for (row, bits) in glyph.iter().enumerate() {
                for col in 0..8 {
                    if bits & (1 << col) != 0 {
                        self.rect(
                            x + (i as i32 * 8 + col) * scale,
                            y + row as i32 * scale,
                            scale,
                            scale,
                            c,
                        );
                    }
                }
            }
        }
    }

    /// Text centred on x.
    pub fn text_c(&mut self, x: i32, y: i32, s: &str, c: Rgb, scale: i32) {
        self.text(x - Self::text_width(s, scale) / 2, y, s, c, scale);
    }

    /// Text ending at x.
    pub fn text_r(&mut self, x: i32, y: i32, s: &str, c: Rgb, scale: i32) {
        self.text(x - Self::text_width(s, scale), y, s, c, scale);
    }

    /// Text rotated 90° counter-clockwise, reading bottom to top, centred on y.
    pub fn text_up(&mut self, x: i32, y: i32, s: &str, c: Rgb) {
        let len = Self::text_width(s, 1);
        let y0 = y + len / 2;
        for (i, ch) in s.chars().enumerate() {
            let code = if ch.is_ascii() {
                ch as usize
            } else {
                '?' as usize
            };
            let glyph = font8x8::legacy::BASIC_LEGACY[code];
            for (row, bits) in glyph.iter().enumerate() {
                for col in 0..8 {
                    if bits & (1 << col) != 0 {
                        self.set(x + row as i32, y0 - (i as i32 * 8 + col), c);
                    }
                }
            }
        }
    }

    /// The image as a PNG file (8-bit RGB, zlib-compressed).
    pub fn png(&self) -> Vec<u8> {
        let mut raw = Vec::with_capacity((self.w * 3 + 1) as usize * self.h as usize);
        for y in 0..self.h {
            raw.push(0); // filter: none
            for x in 0..self.w {
                raw.extend_from_slice(&self.px[(y * self.w + x) as usize]);
            }
        }
        let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
        let mut ihdr = Vec::new();
        ihdr.extend_from_slice(&(self.w as u32).to_be_bytes());
        ihdr.extend_from_slice(&(self.h as u32).to_be_bytes());
        ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
        chunk(&mut out, b"IHDR", &ihdr);
        chunk(
            &mut out,
            b"IDAT",
            &miniz_oxide::deflate::compress_to_vec_zlib(&raw, 9),
        );
        chunk(&mut out, b"IEND", &[]);
        out
    }
}

fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    let start = out.len();
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    let crc = crc32(&out[start..]);
    out.extend_from_slice(&crc.to_be_bytes());
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc_matches_the_reference() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b"IEND"), 0xAE42_6082);
    }

    #[test]
    fn png_has_signature_and_chunks() {
        let mut c = Canvas::new(10, 5, [255, 255, 255]);
        c.text(0, 0, "A", [0, 0, 0], 1);
        let p = c.png();
        assert!(p.starts_with(b"\x89PNG\r\n\x1a\n"));
        assert_eq!(&p[12..16], b"IHDR");
        assert!(p.ends_with(&[0x49, 0x45, 0x4E, 0x44, 0xAE, 0x42, 0x60, 0x82]));
        let raw =
            miniz_oxide::inflate::decompress_to_vec_zlib(&p[8 + 25 + 8..p.len() - 12 - 4]).unwrap();
        assert_eq!(raw.len(), 5 * (10 * 3 + 1));
    }
}
