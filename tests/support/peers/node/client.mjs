// An ACP Client on the official TypeScript SDK, over Streamable HTTP or WebSocket; a script for
// the tests.
//
//   node --experimental-websocket tests/support/peers/node/client.mjs URL
//
// URL is `http://`, `https://` (the SDK's `createHttpStream`, on Node's `fetch`) or `ws://`,
// `wss://` (its `createWebSocketStream`, on Node's `WebSocket`: Node 20 needs the flag above).
// Node trusts a CA of the test's own through `NODE_EXTRA_CA_CERTS`, as any Node program does.
//
// It sends `initialize`, opens a session, prompts "echo hello" and reads the session's updates
// until the turn stops; then it writes one line to stdout, a JSON object: the Agent's name, the
// texts of the agent message chunks and the stop reason; and exits 0. An error exits 1 with the
// error on stderr.

import { client, methods } from "@agentclientprotocol/sdk";
import { createHttpStream } from "@agentclientprotocol/sdk/experimental/http-client";
import { createWebSocketStream } from "@agentclientprotocol/sdk/experimental/ws-client";

const url = process.argv[2];
const stream = /^wss?:/.test(url) ? createWebSocketStream(url) : createHttpStream(url);

try {
  const report = await client({ name: "ts-sdk-client" }).connectWith(stream, async (agent) => {
    const init = await agent.request(methods.agent.initialize, {
      protocolVersion: 1,
      clientCapabilities: {},
    });
    return agent.buildSession(process.cwd()).withSession(async (session) => {
      await session.prompt("echo hello");
      const chunks = [];
      for (;;) {
        const message = await session.nextUpdate();
        if (message.kind === "stop") {
          return { agent: init.agentInfo?.name, chunks, stopReason: message.stopReason };
        }
        const update = message.update;
        if (update.sessionUpdate === "agent_message_chunk" && update.content.type === "text") {
          chunks.push(update.content.text);
        }
      }
    });
  });
  process.stdout.write(`${JSON.stringify(report)}\n`);
  process.exit(0);
} catch (error) {
  process.stderr.write(`client.mjs: ${error?.stack ?? error}\n`);
  process.exit(1);
}
