local done = redis.call('HGET', KEYS[2], ARGV[1])
if done then return tonumber(done) end
local count
if ARGV[2] == 'set' then
    count = tonumber(ARGV[3])
else
    count = (tonumber(redis.call('GET', KEYS[1]) or '0') or 0) + tonumber(ARGV[3])
    if count < 0 then count = 0 end
    if count > tonumber(ARGV[6]) then count = tonumber(ARGV[6]) end
end
redis.call('SET', KEYS[1], count, 'EX', ARGV[5])
redis.call('HSET', KEYS[2], ARGV[1], count)
redis.call('EXPIRE', KEYS[2], ARGV[4])
return count
