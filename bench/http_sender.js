// Figure 23a's JavaScript senders (bench/http_publish.py runs it): SENDERS
// concurrent EventGridPublisherClient.send() loops of @azure/eventgrid
// (test/azure-sdk/node_modules) in one Node.js process, each sending the
// same 100 Event Grid events (about 1 KB each) to ENDPOINT with KEY for
// SECONDS; the CA is in NODE_EXTRA_CA_CERTS.  Prints the requests sent.
'use strict';
const path = require('path');

if (globalThis.crypto === undefined) globalThis.crypto = require('crypto').webcrypto;
const { EventGridPublisherClient, AzureKeyCredential } = require(
  path.join(__dirname, '..', 'test', 'azure-sdk', 'node_modules', '@azure', 'eventgrid'));

const [endpoint, key, senders, seconds, dataJson] = process.argv.slice(2);
const data = JSON.parse(dataJson);
const events = [];
for (let i = 0; i < 100; i++) {
  events.push({ eventType: 'Bench.OrderCreated', subject: `orders/${i}`, dataVersion: '1.0', data: data[i % data.length] });
}

async function sender(until) {
  const client = new EventGridPublisherClient(endpoint, 'EventGrid', new AzureKeyCredential(key));
  await client.send(events.slice(0, 1));    // the connection made before the clock starts
  await ready;
  let n = 0;
  while (Date.now() < until()) {
    await client.send(events);
    n++;
  }
  return n;
}

let start;
let go;
const ready = new Promise((resolve) => { go = resolve; });
(async () => {
  const running = Array.from({ length: Number(senders) }, () => sender(() => start + Number(seconds) * 1000));
  await new Promise((resolve) => setTimeout(resolve, 200));
  start = Date.now();
  go();
  const counts = await Promise.all(running);
  console.log(JSON.stringify({ requests: counts.reduce((a, b) => a + b, 0), seconds: (Date.now() - start) / 1000 }));
})();
