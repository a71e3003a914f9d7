//! The one function that writes a reply: it walks a [`Reply`] value and counts the
//! elements of every array and map itself (RESP2 and RESP3 alike; the server writes a
//! map as a flat array for RESP2 clients).

use crate::reply::Reply;

use super::Ctx;

pub fn send(ctx: Ctx<'_>, r: &Reply<'_>) {
    match r {
        Reply::Nil => ctx.reply_null(),
        Reply::Int(i) => ctx.reply_int(*i),
        Reply::Ok => ctx.reply_simple(c"OK"),
        Reply::Bulk(b) => ctx.reply_bytes(b.as_slice()),
        Reply::Grant(token, fence) => {
            ctx.reply_array(2);
            ctx.reply_bytes(token.as_slice());
            ctx.reply_int(i64::try_from(*fence).unwrap_or(i64::MAX));
        }
        Reply::Array(items) => {
            ctx.reply_array(items.len());
            for item in items {
                send(ctx, item);
            }
        }
        Reply::Map(pairs) => {
            ctx.reply_map(pairs.len());
            for (k, v) in pairs {
                ctx.reply_bytes(k.as_bytes());
                send(ctx, v);
            }
        }
        Reply::Error(e) => ctx.reply_error(&e.to_string()),
    }
}
