-- A coordinator file of schema version 1, written by the code of 5c7cc50 (SQLiteCoordinator: three
-- cycles of scope a, then b granted and held), dumped with sqlite3's iterdump; application_id 0x53544B43.
BEGIN TRANSACTION;
CREATE TABLE history (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    scope TEXT NOT NULL,
    kind TEXT NOT NULL,
    holder TEXT NOT NULL,
    token INTEGER NOT NULL,
    at_unix_ms INTEGER NOT NULL
) STRICT;
INSERT INTO "history" VALUES(1,'a','grant','h1',387367592144142337,1796422830976);
INSERT INTO "history" VALUES(2,'a','release','h1',387367592144142337,1796422831001);
INSERT INTO "history" VALUES(3,'a','grant','h1',387367592144142338,1796422831012);
INSERT INTO "history" VALUES(4,'a','release','h1',387367592144142338,1796422831013);
INSERT INTO "history" VALUES(5,'a','grant','h1',387367592144142339,1796422831016);
INSERT INTO "history" VALUES(6,'a','release','h1',387367592144142339,1796422831017);
INSERT INTO "history" VALUES(7,'b','grant','h2',387367592144142337,1796422831020);
CREATE TABLE leases (
    scope TEXT PRIMARY KEY,
    lease_id TEXT NOT NULL UNIQUE,
    holder TEXT NOT NULL,
    token INTEGER NOT NULL,
    ttl_ms INTEGER NOT NULL,
    granted_ns INTEGER NOT NULL,
    expires_ns INTEGER NOT NULL
) STRICT;
INSERT INTO "leases" VALUES('b','5rTKPcJeabE_INELQEXBZu6aLj9uc23q','h2',387367592144142337,60000,22016571983742,22076571983742);
CREATE TABLE meta (k TEXT PRIMARY KEY, v TEXT NOT NULL) STRICT;
INSERT INTO "meta" VALUES('cluster_id','c1c054ba6bcf65b1');
INSERT INTO "meta" VALUES('schema_version','1');
INSERT INTO "meta" VALUES('boot_id','e4b3867e-ec85-4f58-a7cd-be39742e38df');
INSERT INTO "meta" VALUES('kind','coordinator');
INSERT INTO "meta" VALUES('mono_offset_ns','0');
INSERT INTO "meta" VALUES('epoch','92355630909');
CREATE TABLE scopes (
    scope TEXT PRIMARY KEY,
    last_token INTEGER NOT NULL,
    delay_until_ns INTEGER NOT NULL
) STRICT;
INSERT INTO "scopes" VALUES('a',387367592144142339,0);
INSERT INTO "scopes" VALUES('b',387367592144142337,0);
CREATE TABLE waiters (
    scope TEXT NOT NULL,
    seq INTEGER NOT NULL,
    lease_id TEXT NOT NULL UNIQUE,
    holder TEXT NOT NULL,
    deadline_ns INTEGER NOT NULL,
    stale_ns INTEGER NOT NULL,
    PRIMARY KEY (scope, seq)
) STRICT;
CREATE INDEX history_by_scope ON history (scope, seq);
DELETE FROM "sqlite_sequence";
INSERT INTO "sqlite_sequence" VALUES('history',7);
COMMIT;
