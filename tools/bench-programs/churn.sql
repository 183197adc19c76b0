-- Table churn for tools/bench under Debian's sqlite3 (run as
-- `sqlite3 :memory: ".read churn.sql"`): 200 000 rows inserted into an
-- in-memory database, indexed, then scanned and grouped. sqlite3 takes
-- its page cache and every statement's memory from malloc.
CREATE TABLE t(a INTEGER PRIMARY KEY, b TEXT, c REAL);
WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r WHERE i < 200000)
INSERT INTO t SELECT i, printf('row%d-%s', i, hex(randomblob(16))), i * 1.5 FROM r;
CREATE INDEX tb ON t(b);
SELECT count(*), sum(length(b)) FROM t WHERE b LIKE 'row1%';
SELECT substr(b, 1, 5), count(*) FROM t GROUP BY substr(b, 1, 5) ORDER BY 2 DESC LIMIT 3;
