-- wrk: bursts of identical deliveries. Both wrk threads walk the same key sequence, 32
-- connections each, so about 64 identical deliveries of a key are in flight together.
local counter = 0
local body = '{"type":"order.paid","data":{"note":"' .. string.rep("x", 960) .. '"}}'
local run = tostring(os.time())
function request()
  counter = counter + 1
  return wrk.format("POST", wrk.path, {["Content-Type"] = "application/json",
    ["Idempotency-Key"] = "burst-" .. run .. "-" .. math.floor(counter / 32)}, body)
end
