/*
 * wal_source.h - WAL sources (SPEC 19, README "Events from managed
 * PostgreSQL"): a background worker per source reads another server's
 * write-ahead log through a logical replication slot (pgoutput, over
 * libpq's replication connection) and publishes here what it finds:
 * pg_logical_emit_message() messages with the source's prefix, and the
 * changes of mapped tables.  wal_source_worker.c runs the connection and
 * the stream, wal_source_decode.c turns pgoutput's messages into events,
 * wal_source_functions.c holds the SQL-callable helpers.
 */
#ifndef EVENTGRID_WAL_SOURCE_H
#define EVENTGRID_WAL_SOURCE_H

#include "core/eventgrid.h"

#include "access/xlogdefs.h"
#include "lib/stringinfo.h"

/*
 * The advisory lock (two keys: this class, the source's id) a source's
 * worker holds for its whole life: one worker per source, and how the
 * upkeep worker and drop_wal_source() find it.
 */
#define EG_WAL_SOURCE_LOCK_CLASS 1162302291

/* The replication origin of source id ("eventgrid_wal_source_<id>") into buf. */
#define EG_WAL_ORIGIN_NAME_LEN 64
extern void eg_wal_origin_name(int64 id, char *buf);

/* What a source's transaction being read has made so far (wal_source_decode.c). */
typedef struct EgWalTxn
{
	XLogRecPtr	commit_lsn;		/* the source's commit record (from BEGIN) */
	TimestampTz commit_time;
	int			changes;		/* row changes the source sent for it so far */
	bool		local_open;		/* a transaction here holds its events */
	int64		events;			/* events stored */
	int64		rejects;		/* rows written to wal_source_rejects */
} EgWalTxn;

/* One source being read (wal_source_worker.c sets it up). */
typedef struct EgWalSource
{
	int64		id;
	char	   *name;
	char	   *message_prefix;
	char	   *system_identifier;	/* the source's, for events' ids */
	char	   *database;		/* the source's database name, for CloudEvents' source */
	EgWalTxn	txn;
	bool		in_txn;			/* between BEGIN and COMMIT */
} EgWalSource;

/*
 * wal_source_decode.c: applies one pgoutput message (a logical replication
 * protocol message after its XLogData header) of source src; returns the
 * end LSN of a source transaction it committed here (COMMIT), else
 * InvalidXLogRecPtr.  Each source transaction's events and rejects are
 * committed in one transaction here, with the replication origin's
 * progress (the session's origin must be set up).
 */
extern XLogRecPtr eg_wal_apply(EgWalSource *src, StringInfo msg);
/* Forgets the relations the stream described (a new connection describes them again). */
extern void eg_wal_reset_relations(void);

/*
 * wal_source_worker.c: opens a unit of work (eg_store_begin(), committed by
 * eg_store_commit()); when the extension is missing or of another version
 * than the library, the worker leaves instead.
 */
extern void eg_wal_begin(const char *activity);
/* wal_source_worker.c: the upkeep worker starts a worker for each unpaused source that has none */
extern void eg_wal_sources_start(void);

#endif							/* EVENTGRID_WAL_SOURCE_H */
