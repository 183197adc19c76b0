# Object churn for tools/bench, run with PYTHONMALLOC=malloc so every object
# goes through malloc: dicts, lists, strings and tuples created and dropped,
# with a slowly rotating live set.
import sys

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 200
keep = []
for r in range(rounds):
    batch = [{"id": i, "name": "item-%d" % i, "tags": [str(i), str(r)]} for i in range(1000)]
    keep.append(batch[r % 1000])
    if len(keep) > 500:
        keep.pop(0)
    text = ",".join(d["name"] for d in batch)
    parts = tuple(text.split(","))
    del batch, text, parts
print(len(keep))
