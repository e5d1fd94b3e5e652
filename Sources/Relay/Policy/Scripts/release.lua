-- Ends the claim of ARGV[1]. Answers the entry parked behind it, if any: {id, due} (its
-- index member is moved up to then, as it waited for this claim rather than for its due time).
if redis.call('HGET', KEYS[1], 'cid') == ARGV[1] then
    redis.call('HDEL', KEYS[1], 'cid', 'c', 'ce', 'cu', 't:' .. ARGV[1])
    markWaiting(2)
    local parked = redis.call('HMGET', KEYS[1], 'pid', 'pd')
    if parked[1] then return {parked[1], tonumber(parked[2]) or 0} end
end
return 0
