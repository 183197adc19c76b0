// Map churn for tools/bench under node: a Map of 300 000 small objects
// (an array and a string each) built while a third of its keys are deleted,
// then 50 000 entries serialized to JSON. V8 keeps its JS heap in its own
// pages; what reaches malloc is its runtime's and the JSON writer's memory,
// allocated from C++ called from JIT code (frames without CFI).
const n = process.argv.length > 2 ? Number(process.argv[2]) : 300000;
const m = new Map();
for (let i = 0; i < n; i++) {
    m.set("k" + i, {a: i, b: [i, i + 1], s: "x".repeat(i % 50)});
    if (i % 3 === 0) m.delete("k" + (i >> 1));
}
const text = JSON.stringify([...m.entries()].slice(0, 50000));
console.log(text.length);
