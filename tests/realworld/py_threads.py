"""A threaded Python workload for tests/realworld: eight threads build and
drop dicts, lists, strings and JSON documents, exchange objects through a
queue, and the result printed is the same in every run (PYTHONHASHSEED=0).
Run by Debian's /usr/bin/python3 with PYTHONMALLOC=malloc, so every Python
object is a malloc block the recorder sees."""

import hashlib
import json
import queue
import threading

THREADS = 8
ROUNDS = 1000

results = {}
handoff = queue.Queue(maxsize=64)


def work(n):
    digest = hashlib.sha256()
    table = {}
    for i in range(ROUNDS):
        doc = {"thread": n, "round": i, "items": [str(i * k) for k in range(20)], "nested": {"x": [i] * 10}}
        text = json.dumps(doc, sort_keys=True)
        table[i % 50] = json.loads(text)
        digest.update(text.encode())
        if i % 10 == 0:
            handoff.put((n, i, [text] * 3))
    results[n] = (digest.hexdigest()[:16], len(table))


def consume(expected):
    seen = 0
    total = 0
    while seen < expected:
        n, i, texts = handoff.get()
        total += sum(len(t) for t in texts)
        seen += 1
    results["consumer"] = (seen, total)


threads = [threading.Thread(target=work, args=(n,)) for n in range(THREADS)]
consumer = threading.Thread(target=consume, args=(THREADS * ROUNDS // 10,))
consumer.start()
for t in threads:
    t.start()
for t in threads:
    t.join()
consumer.join()
for key in sorted(results, key=str):
    print(key, results[key])
