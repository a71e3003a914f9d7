//! What a lock is, independent of the server and of waiting: the value a lock key holds
//! and its validity rule ([`value`]), the fence counter ([`fence`]), and every encoding of
//! a value and of a change ([`codec`]).

pub mod codec;
pub mod fence;
pub mod holder;
pub mod value;
