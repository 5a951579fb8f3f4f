// Verifies the requests test/receiver.py logged, with the Standard Webhooks
// reference library for JavaScript (the npm package standardwebhooks,
// vendored in node_modules: see README).  Prints one line per request:
// "ok <webhook-id>" or "fail <the library's reason>".
//   node verify.js <secret> <receiver log (.jsonl)> [path]
"use strict";
const fs = require("fs");
const { Webhook } = require("standardwebhooks");

const [secret, log, path] = process.argv.slice(2);
const wh = new Webhook(secret);
for (const line of fs.readFileSync(log, "utf8").split("\n")) {
  if (!line) continue;
  const r = JSON.parse(line);
  if (path && r.path !== path) continue;
  try {
    wh.verify(r.body, r.headers);
    console.log("ok " + r.headers["webhook-id"]);
  } catch (e) {
    console.log("fail " + e.message);
  }
}
