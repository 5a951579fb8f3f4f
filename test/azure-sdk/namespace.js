// Namespace topics through the HTTP listener with the JavaScript Azure SDK
// (@azure/eventgrid-namespaces' EventGridSenderClient and
// EventGridReceiverClient), unchanged: only the endpoint (the database's
// URL), the key and the CA (NODE_EXTRA_CA_CERTS) are ours.
//
//   node namespace.js send    ENDPOINT KEY TOPIC COUNT single|batch
//   node namespace.js receive ENDPOINT KEY TOPIC SUBSCRIPTION MAX_EVENTS MAX_WAIT_SECONDS
//   node namespace.js OPERATION ENDPOINT KEY TOPIC SUBSCRIPTION TOKENS_JSON [RELEASE_DELAY]
//        (OPERATION: acknowledge, release, reject, renew)
//
// Prints one line of JSON: {"sent": N}; {"events": [{"lockToken",
// "deliveryCount", "id", "data"}], "ms": ...}; {"succeeded": [...],
// "failed": [{"lockToken", "code"}]}; or {"status", "code", "message"} for
// the SDK's RestError.
'use strict';
const path = require('path');

// The SDK's packages ask for Node.js 20, which has Web Crypto as a global;
// Debian 12's Node.js 18 has the same object as require('crypto').webcrypto.
if (globalThis.crypto === undefined) globalThis.crypto = require('crypto').webcrypto;

const {
  EventGridSenderClient, EventGridReceiverClient, AzureKeyCredential,
} = require(path.join(__dirname, 'node_modules', '@azure', 'eventgrid-namespaces'));

async function main() {
  const [command, endpoint, key, topic, ...rest] = process.argv.slice(2);
  const cred = new AzureKeyCredential(key);
  if (command === 'send') {
    const [countText, shape] = rest;
    const events = [];
    for (let i = 0; i < Number(countText); i++) {
      events.push({ type: 'Contoso.Orders.Created', source: '/contoso/orders', data: { n: i } });
    }
    const sender = new EventGridSenderClient(endpoint, cred, topic);
    if (shape === 'single') {
      for (const e of events) await sender.sendEvents(e);
    } else {
      await sender.sendEvents(events);
    }
    return { sent: events.length };
  }
  const [subscription, ...args] = rest;
  const receiver = new EventGridReceiverClient(endpoint, cred, topic, subscription);
  if (command === 'receive') {
    const t0 = Date.now();
    const result = await receiver.receiveEvents({ maxEvents: Number(args[0]), maxWaitTime: Number(args[1]) });
    return {
      events: result.details.map((d) => ({
        lockToken: d.brokerProperties.lockToken,
        deliveryCount: d.brokerProperties.deliveryCount,
        id: d.event.id,
        data: d.event.data,
      })),
      ms: Date.now() - t0,
    };
  }
  const tokens = JSON.parse(args[0]);
  let result;
  if (command === 'acknowledge') result = await receiver.acknowledgeEvents(tokens);
  else if (command === 'release') result = await receiver.releaseEvents(tokens, args[1] ? { releaseDelay: args[1] } : undefined);
  else if (command === 'reject') result = await receiver.rejectEvents(tokens);
  else if (command === 'renew') result = await receiver.renewEventLocks(tokens);
  else throw new Error(`unknown command ${command}`);
  return {
    succeeded: result.succeededLockTokens,
    failed: result.failedLockTokens.map((f) => ({ lockToken: f.lockToken, code: f.error.code })),
  };
}

main().then(
  (out) => console.log(JSON.stringify(out)),
  (e) => {
    if (e.statusCode === undefined) {
      console.error(e);
      process.exit(1);
    }
    // the SDK's RestError carries the answer's {"error":{"code","message"}}
    console.log(JSON.stringify({ status: e.statusCode, code: e.code, message: e.message }));
  },
);
