// Publishes through the HTTP listener with the JavaScript Azure SDK
// (@azure/eventgrid's EventGridPublisherClient), unchanged: only the
// endpoint, the credential and the CA that signed the listener's
// certificate (NODE_EXTRA_CA_CERTS) are ours.
//
//   node publisher.js ENDPOINT CREDENTIAL SECRET KIND COUNT [EXPIRY]
//
// CREDENTIAL: key (AzureKeyCredential: aeg-sas-key) or sas (a SAS token
// that generateSharedAccessSignature() signs with SECRET, in its own expiry
// format "11/27/2026 2:15:33 PM", expiring at EXPIRY, an ISO date-time, or
// in an hour).  KIND: eventgrid, cloudevent or custom.  Prints "sent N" or
// "error STATUS CODE MESSAGE".
'use strict';
const path = require('path');

// The SDK's packages ask for Node.js 20, which has Web Crypto as a global;
// Debian 12's Node.js 18 has the same object as require('crypto').webcrypto.
if (globalThis.crypto === undefined) globalThis.crypto = require('crypto').webcrypto;
const {
  EventGridPublisherClient, AzureKeyCredential, AzureSASCredential, generateSharedAccessSignature,
} = require(path.join(__dirname, 'node_modules', '@azure', 'eventgrid'));

async function main() {
  const [endpoint, credential, secret, kind, countText, expiryText] = process.argv.slice(2);
  const count = Number(countText);
  let cred = new AzureKeyCredential(secret);
  if (credential === 'sas') {
    const expiry = expiryText ? new Date(expiryText) : new Date(Date.now() + 3600 * 1000);
    cred = new AzureSASCredential(await generateSharedAccessSignature(endpoint, cred, expiry));
  }
  const schema = { eventgrid: 'EventGrid', cloudevent: 'CloudEvent', custom: 'Custom' }[kind];
  const events = [];
  for (let i = 0; i < count; i++) {
    if (kind === 'eventgrid') {
      events.push({ eventType: 'Contoso.Orders.Created', subject: `orders/${i}`, dataVersion: '1.0', data: { n: i } });
    } else if (kind === 'cloudevent') {
      events.push({ type: 'Contoso.Orders.Created', source: '/contoso/orders', data: { n: i } });
    } else {
      events.push({ kind: 'order', n: i });
    }
  }
  const client = new EventGridPublisherClient(endpoint, schema, cred);
  try {
    await client.send(events);
    console.log(`sent ${count}`);
  } catch (e) {
    let err = {};
    try { err = JSON.parse(e.response.bodyAsText).error || {}; } catch (_) { /* no body */ }
    console.log(`error ${e.statusCode} ${err.code} ${err.message}`);
    if (e.statusCode === undefined) console.error(e);
  }
}

main().catch((e) => { console.error(e); process.exit(1); });
