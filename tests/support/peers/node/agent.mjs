// An ACP Agent on the official TypeScript SDK's Streamable HTTP server; a script for the tests.
//
//   node tests/support/peers/node/agent.mjs [--tls-cert FILE --tls-key FILE]
//
// The SDK's `AcpServer` (`@agentclientprotocol/sdk/experimental/server`) behind its Node adapter
// serves POST, GET and DELETE on /acp, on 127.0.0.1 and a port the system picks. It is the
// server the TypeScript SDK ships: it requires `Acp-Session-Id` on every POST whose message has
// `params.sessionId` (400 "Missing Acp-Session-Id" otherwise), and on the Client's answer to a
// request it sent on a session's stream.
//
// Sessions live in this process, shared by every connection, so a session made on one connection
// can be loaded or resumed on another. Scripted like tests/support/peers/sdk_agent.py:
//
// - `session/new`: a new session with an empty history.
// - `session/load` of a known session: each chunk of its history again as a `session/update`,
//   then `{}`; an unknown session: error -32002.
// - `session/resume` of a known session: one chunk `resumed`, then `{}`; unknown: -32002.
// - `session/prompt` "echo TEXT": a chunk TEXT; "permission": asks the Client
//   (`session/request_permission`, options `allow` and `reject`), then a chunk
//   "permission: selected OPTION_ID" (or "permission: cancelled"); anything else: a chunk
//   "unknown prompt". Every prompt's chunk joins the session's history. Then `end_turn`.
//
// With `--tls-cert` and `--tls-key` (PEM) it serves HTTPS (`node:https`) instead.
//
// Once listening it writes exactly one line to stdout, `LISTENING http://127.0.0.1:PORT/acp`
// (`https://` in TLS), and nothing else; it stops on SIGTERM or SIGINT.

import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { createServer } from "node:http";
import { createServer as createTlsServer } from "node:https";
import { parseArgs } from "node:util";

import { RequestError, agent, methods } from "@agentclientprotocol/sdk";
import { AcpServer } from "@agentclientprotocol/sdk/experimental/server";
import { createNodeHttpHandler } from "@agentclientprotocol/sdk/experimental/node";

const HOST = "127.0.0.1";
const PATH = "/acp";

const { values: args } = parseArgs({
  options: { "tls-cert": { type: "string" }, "tls-key": { type: "string" } },
});
const tls =
  args["tls-cert"] === undefined
    ? undefined
    : { cert: readFileSync(args["tls-cert"]), key: readFileSync(args["tls-key"]) };

/** Chunks said in each session, by session id, for every connection. */
const histories = new Map();

function chunk(sessionId, text) {
  return {
    sessionId,
    update: { sessionUpdate: "agent_message_chunk", content: { type: "text", text } },
  };
}

function historyOf(sessionId) {
  const history = histories.get(sessionId);
  if (history === undefined) {
    throw RequestError.resourceNotFound(sessionId);
  }
  return history;
}

function promptText(prompt) {
  return prompt
    .filter((block) => block.type === "text")
    .map((block) => block.text)
    .join("");
}

async function askPermission(client, sessionId) {
  const answer = await client.request(methods.client.session.requestPermission, {
    sessionId,
    toolCall: { toolCallId: "call-1", title: "touch a file", status: "pending" },
    options: [
      { optionId: "allow", name: "Allow", kind: "allow_once" },
      { optionId: "reject", name: "Reject", kind: "reject_once" },
    ],
  });
  const outcome = answer.outcome;
  return outcome.outcome === "selected"
    ? `permission: selected ${outcome.optionId}`
    : "permission: cancelled";
}

const app = agent({ name: "ts-sdk-agent" })
  .onRequest(methods.agent.initialize, () => ({
    protocolVersion: 1,
    agentCapabilities: { loadSession: true },
    agentInfo: { name: "ts-sdk-agent", version: "1" },
  }))
  .onRequest(methods.agent.session.new, () => {
    const sessionId = `sess-${randomUUID()}`;
    histories.set(sessionId, []);
    return { sessionId };
  })
  .onRequest(methods.agent.session.load, async ({ params, client }) => {
    for (const text of historyOf(params.sessionId)) {
      await client.notify(methods.client.session.update, chunk(params.sessionId, text));
    }
    return {};
  })
  .onRequest(methods.agent.session.resume, async ({ params, client }) => {
    historyOf(params.sessionId);
    await client.notify(methods.client.session.update, chunk(params.sessionId, "resumed"));
    return {};
  })
  .onRequest(methods.agent.session.prompt, async ({ params, client }) => {
    const history = historyOf(params.sessionId);
    const text = promptText(params.prompt);
    let said = "unknown prompt";
    if (text.startsWith("echo ")) {
      said = text.slice("echo ".length);
    } else if (text === "permission") {
      said = await askPermission(client, params.sessionId);
    }
    history.push(said);
    await client.notify(methods.client.session.update, chunk(params.sessionId, said));
    return { stopReason: "end_turn" };
  });

const acp = new AcpServer({ agent: app });
const handle = createNodeHttpHandler(acp);
function serve(req, res) {
  const path = new URL(req.url ?? "/", `http://${HOST}`).pathname;
  if (path !== PATH) {
    res.writeHead(404, { "Content-Type": "text/plain" }).end("Not Found");
    return;
  }
  handle(req, res);
}
const server = tls === undefined ? createServer(serve) : createTlsServer(tls, serve);

server.listen(0, HOST, () => {
  const scheme = tls === undefined ? "http" : "https";
  process.stdout.write(`LISTENING ${scheme}://${HOST}:${server.address().port}${PATH}\n`);
});

function stop() {
  server.closeAllConnections();
  server.close();
  void acp.close().finally(() => process.exit(0));
}
process.on("SIGTERM", stop);
process.on("SIGINT", stop);
