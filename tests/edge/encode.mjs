// Test helper: encode texts with runtime/web/tokenizer.mjs.
//   node tests/edge/encode.mjs TOKENIZER_JSON < texts.json   ->  [[ids...], ...] or {"error": ...}
import { readFileSync } from "node:fs";
import { Tokenizer } from "../../runtime/web/tokenizer.mjs";

const texts = JSON.parse(readFileSync(0, "utf8"));
try {
  const tok = Tokenizer.fromJSON(JSON.parse(readFileSync(process.argv[2], "utf8")));
  console.log(JSON.stringify(texts.map((t) => ({ ids: tok.encode(t), text: tok.decode(tok.encode(t)) }))));
} catch (err) {
  console.log(JSON.stringify({ error: `${err.name}: ${err.message}` }));
}
