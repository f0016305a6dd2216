// A Greeter server and client in one process, on the installed package.
import { Code, TopspinError, createClient } from "@topspin/topspin";
import { Server, connect } from "@topspin/topspin/node";
import { Greeter } from "./gen/greet/v1/greet_pb.js";

const server = new Server().service(Greeter, {
  greet: (req) => {
    if (req.name === "") throw new TopspinError(Code.INVALID_ARGUMENT, "who?");
    return { greeting: `hello, ${req.name}` };
  },
  async *greetMany(req) {
    for (const word of ["hello", "hi", "hey"]) yield { greeting: `${word}, ${req.name}` };
  },
});
const address = await server.listen("tcp://127.0.0.1:0"); // any free port

const channel = connect(address);
const greeter = createClient(Greeter, channel);
console.log((await greeter.greet({ name: "newcomer" }, { timeoutMs: 5000 })).greeting);
for await (const r of greeter.greetMany({ name: "newcomer" })) console.log(r.greeting);
try {
  await greeter.greet({ name: "" });
} catch (e) {
  if (!(e instanceof TopspinError)) throw e;
  console.log(`${Code[e.code]}: ${e.rawMessage}`);
}
channel.close();
await server.close();
