-- A device's 429 backoff (`<until ms> <level>` at `key`): a 429 at `now` backs the device off
-- for `base` ms doubled per level, up to `top`; a 429 more than `top` after the last backoff
-- ended starts again at level 0. Answers when the backoff ends.
local function backOff(key, now, base, top)
    local bu, bl = 0, 0
    local b = redis.call('GET', key)
    if b then
        local u, l = string.match(b, '^(%d+) (%d+)$')
        bu, bl = tonumber(u) or 0, tonumber(l) or 0
    end
    if bu == 0 or now > bu + top then bl = 0 else bl = bl + 1 end
    local length = math.min(top, base * (2 ^ math.min(bl, 30)))
    bu = now + length
    redis.call('SET', key, bu .. ' ' .. bl, 'PX', length + top)
    return bu
end
