-- Moves a claimed entry no relay can read out of its mailbox: KEYS mailbox, waiting, quarantine;
-- ARGV id, how long the quarantine keeps it (ms). Only while `id` holds the claim (answers 1).
if redis.call('HGET', KEYS[1], 'cid') ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[3], redis.call('HGET', KEYS[1], 'c') or '', 'PX', ARGV[2])
redis.call('HDEL', KEYS[1], 'cid', 'c', 'ce', 'cu', 't:' .. ARGV[1])
markWaiting(2)
return 1
