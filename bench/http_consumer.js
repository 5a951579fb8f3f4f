// Figure 23c's JavaScript consumers (bench/http_publish.py runs it): CONSUMERS
// concurrent loops of @azure/eventgrid-namespaces' EventGridReceiverClient
// (test/azure-sdk/node_modules) in one Node.js process, each receiving up
// to 100 events (maxWaitTime 10 s) of queue subscription SUBSCRIPTION of
// namespace topic TOPIC at ENDPOINT with KEY and acknowledging them, until
// TOTAL are acknowledged; the CA is in NODE_EXTRA_CA_CERTS.  Prints how
// many were acknowledged and the seconds from the start to the last
// acknowledgement.
'use strict';
const path = require('path');

if (globalThis.crypto === undefined) globalThis.crypto = require('crypto').webcrypto;
const { EventGridReceiverClient, AzureKeyCredential } = require(
  path.join(__dirname, '..', 'test', 'azure-sdk', 'node_modules', '@azure', 'eventgrid-namespaces'));

const [endpoint, key, topic, subscription, consumers, totalText] = process.argv.slice(2);
const total = Number(totalText);
let acked = 0;
let last = 0;
const start = Date.now();

async function consumer() {
  const receiver = new EventGridReceiverClient(endpoint, new AzureKeyCredential(key), topic, subscription);
  while (acked < total) {
    const { details } = await receiver.receiveEvents({ maxEvents: 100, maxWaitTime: 10 });
    if (details.length === 0) continue;
    const result = await receiver.acknowledgeEvents(details.map((d) => d.brokerProperties.lockToken));
    acked += result.succeededLockTokens.length;
    last = Date.now();
  }
}

Promise.all(Array.from({ length: Number(consumers) }, consumer)).then(() => {
  console.log(JSON.stringify({ acked, seconds: (last - start) / 1000 }));
});
