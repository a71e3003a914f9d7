-- INFO lock for prometheus-redis-exporter's -script flag: every numeric lock_* field of
-- the redis-lock module's INFO section, as the key/value pairs the exporter turns into
-- redis_script_values{key="lock_<field>"} (gauges). The exporter's own INFO ALL does not
-- include module sections, and it keeps only fields it knows, so without this script it
-- exports none of them. Read-only: it runs INFO and nothing else. docs/MONITORING.md.
local out = {}
for k, v in string.gmatch(redis.call('INFO', 'lock'), '(lock_[%w_]+):(%d+)') do
  out[#out + 1] = k
  out[#out + 1] = v
end
return out
