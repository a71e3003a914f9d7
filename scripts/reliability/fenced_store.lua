-- Fenced write: the store side of redis-lock's fencing tokens (Kleppmann's fix for a
-- lock holder that pauses past its lease). Run it on the server that holds the
-- protected data (any Redis; the lock module is not needed there).
--
--   EVAL "<this script>" 1 <resource> <fence> <value>   -> 1 written, 0 refused
--
-- The resource is a hash {value, fence}. A write is accepted only if its fence is not
-- lower than the highest fence accepted so far, so a holder whose lease ran out (and
-- whose lock was granted to someone else, with a higher fence) cannot overwrite the
-- newer holder's data. Equal fences are accepted: one holder may write several times.
--
-- Fences are compared as decimal strings: a new server's fences (about 2^51) fit in a
-- Lua number (a double), but a server that issued fences before it was upgraded, or one
-- loaded with fence-shift 20, gives fences above 2^53, where doubles lose precision and
-- tonumber() comparisons would be wrong. Strings compare every fence exactly.
local fence = ARGV[1]
if not string.match(fence, '^[1-9][0-9]*$') or #fence > 19 then
  return redis.error_reply('ERR fence must be a positive decimal integer')
end
local last = redis.call('HGET', KEYS[1], 'fence')
if last and (#fence < #last or (#fence == #last and fence < last)) then
  return 0
end
redis.call('HSET', KEYS[1], 'value', ARGV[2], 'fence', fence)
return 1
