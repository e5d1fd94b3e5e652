-- A 429 in shadow mode: the device's backoff moves as a park after a 429 moves it in enforce
-- mode (park.lua), and nothing parks. KEYS: backoff. ARGV: now ms, base ms, top ms.
return backOff(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]))
