if redis.call('HGET', KEYS[1], 'cid') == ARGV[1] then
    redis.call('HDEL', KEYS[1], 'cid', 'c', 'ce', 'cu', 't:' .. ARGV[1])
    markWaiting(2)
end
return 0
