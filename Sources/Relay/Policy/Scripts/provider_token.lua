local jwt = redis.call('HGET', KEYS[1], 'jwt')
local iat = tonumber(redis.call('HGET', KEYS[1], 'iat') or '0')
local now = tonumber(ARGV[1])
local age = now - iat
local replace = (not jwt)
    or (age < -tonumber(ARGV[6]))
    or (age >= tonumber(ARGV[2]) and age >= tonumber(ARGV[3]))
    or (ARGV[5] ~= '' and jwt == ARGV[5] and age >= tonumber(ARGV[3]))
if not replace then return {jwt, tostring(iat), 0} end
if ARGV[4] == '' then return {false, '0', 0} end
redis.call('HSET', KEYS[1], 'jwt', ARGV[4], 'iat', ARGV[1])
redis.call('EXPIRE', KEYS[1], 3600)
return {ARGV[4], ARGV[1], 1}
