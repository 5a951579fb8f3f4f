/*
 * eventgrid.h - what every eventgrid C file shares (the core folder, on
 * which every other stands): the contract's limits, the GUC variables
 * (settings.c), the clock (clock.c), what a commit leaves for (commit.c),
 * and the shared memory through which publishers wake the delivery
 * workers, the launcher tracks each database's workers (databases.c) and
 * the workers share rate buckets (rate.h) and per-host request counts.
 * Each folder above has headers of its own: http/http.h (requests and
 * libcurl), store/store.h (the queue's SQL), publish/publish.h,
 * delivery/delivery.h and delivery/endpoint.h; hooks.h at src/'s top.
 * docs/ARCHITECTURE.md draws the folders.
 */
#ifndef EVENTGRID_H
#define EVENTGRID_H

#include "postgres.h"

#include "core/compat.h"
#include "datatype/timestamp.h"
#include "postmaster/bgworker.h"
#include "lib/stringinfo.h"
#include "port/atomics.h"
#include "storage/condition_variable.h"
#include "storage/latch.h"
#include "storage/spin.h"
#include "utils/jsonb.h"

/* SPEC section 3, 4, 5 and 8 limits. */
#define EG_MAX_EVENT_BYTES (1024 * 1024)
#define EG_MAX_DELIVERY_ATTEMPTS 30
#define EG_MAX_DELIVERY_COUNT 10	/* namespace topics */

/*
 * What the store estimates a delivery worker holds per delivery besides
 * the event's text (which the request body repeats), to size a claim
 * against eventgrid.max_bytes_in_flight: its delivery and request records,
 * their strings and its header block.  Once a claim is built its rows are
 * charged what it really holds (delivery_claim.c); for 1 KB events that
 * came to 3.1-3.2 kB per delivery against this estimate's 3.0 kB
 * (bench/RESULTS.md, "Memory with many subscriptions").
 */
#define EG_DELIVERY_OVERHEAD_BYTES 2048

/* Set by the Makefile from eventgrid.control; the workers compare it with the schema's. */
#ifndef EG_VERSION
#error "EG_VERSION must be defined"
#endif

/* GUCs (settings.c) */
extern char *eg_database_name;	/* unused since 0.9.0: every database with the extension is served */
extern int	eg_max_databases;
extern int	eg_worker_idle_timeout_s;
extern int	eg_delivery_workers;
extern int	eg_max_concurrent_requests;
#define EG_MAX_CONCURRENT_REQUESTS_LIMIT 1000	/* upper bound of eventgrid.max_concurrent_requests */
extern int	eg_response_timeout_ms;
extern int	eg_retry_jitter_percent;
extern int	eg_max_retry_after_s;
extern int	eg_clock_offset_s;
extern int	eg_default_max_events_per_batch;
extern int	eg_default_preferred_batch_kb;
extern bool eg_delivery_paused;
extern int	eg_max_bytes_in_flight_kb;
extern int	eg_event_table_rotation_s;
extern int	eg_event_retention_s;	/* eventgrid.event_retention, seconds */
extern int	eg_replication_sync_wait_s;	/* eventgrid.replication_sync_wait, seconds */
extern int	eg_max_requests_per_endpoint;
extern int	eg_probation_failures;
extern int	eg_attempt_history;
extern int	eg_attempt_history_retention_s;
extern int	eg_attempt_history_max_rows;
extern char *eg_ssl_ca_file;
extern char *eg_webhook_request_origin;
extern char *eg_entra_authority;	/* eventgrid.entra_authority */
extern int	eg_http_port;			/* eventgrid.http_port: 0, no HTTP listener (SPEC 16) */
extern char *eg_http_listen_addresses;
extern char *eg_http_ssl_cert_file;
extern char *eg_http_ssl_key_file;
extern int	eg_http_max_connections;
extern int	eg_http_connection_timeout_s;
extern int	eg_http_request_timeout_s;	/* eventgrid.http_request_timeout: a whole request's deadline */
extern int	eg_http_max_connections_per_address;
extern int	eg_http_max_requests_in_flight;
extern char *eg_debug_pause_points;	/* eventgrid.debug_pause_points (pause.c) */
#define EG_HTTP_MAX_IN_FLIGHT_LIMIT 256	/* upper bound of eventgrid.http_max_requests_in_flight */

/* eventgrid.attempt_history: which delivery attempts the history keeps. */
typedef enum EgHistoryMode
{
	EG_HISTORY_ALL,
	EG_HISTORY_FAILURES,
	EG_HISTORY_OFF
} EgHistoryMode;

/* Delivery attempt history: three tables that take turns (store_rotation.c). */
#define EG_HISTORY_TABLES 3

/* Published events go to three event tables that take turns (clock.c). */
#define EG_EVENT_TABLES 3
extern int	eg_event_table_at(TimestampTz ts);
/* When event table k (not the current one at ts) last stopped taking new events. */
extern TimestampTz eg_event_table_turn_end(int k, TimestampTz ts);

/*
 * Most delivery workers eventgrid.delivery_workers may ask for, per
 * database.  Worker k (1 to eventgrid.delivery_workers) has entry k - 1 of
 * its database slot's arrays below; what it claims is leased to its pid
 * (lease_owner).
 */
#define EG_MAX_DELIVERY_WORKERS 8

/* Token buckets of rate-limited event subscriptions (rate.c), cluster-wide. */
#define EG_RATE_BUCKETS 4096
typedef struct EgRateBucket
{
	Oid			dboid;			/* with subscription_id, the key */
	int64		subscription_id;	/* 0: free */
	double		tokens;			/* events that may be claimed now */
	TimestampTz at;				/* when tokens was last brought up to date */
} EgRateBucket;

/*
 * Requests in flight to one endpoint host (scheme, host and port), from
 * every delivery worker of every database: eventgrid.max_requests_per_endpoint
 * bounds the sum (endpoint_queue.c).  Keyed by a 64-bit hash of the host
 * key; a slot whose count is 0 is free.
 */
#define EG_HOST_SLOTS 4096
typedef struct EgHostSlot
{
	uint64		hash;
	int32		in_flight;
} EgHostSlot;

/* What the launcher knows of a database (databases.c). */
typedef enum EgDbState
{
	EG_DB_FREE = 0,				/* the slot is unused */
	EG_DB_UNKNOWN,				/* a worker must connect to see whether the extension is there */
	EG_DB_ABSENT,				/* no eventgrid extension */
	EG_DB_OTHER_VERSION,		/* the extension, in another version than the library's */
	EG_DB_READY					/* the extension, in the library's version */
} EgDbState;

/*
 * One database the launcher knows (from pg_database), and its workers.  A
 * pid slot is set by the worker itself once it has registered the exit
 * callback that clears it, so it is non-zero exactly while that process
 * lives (a crash of any backend re-creates shared memory): the launcher and
 * the upkeep worker read liveness from the slots, never from kill(pid, 0),
 * which a reused pid would fool.  Everything here is under
 * eg_shared->mutex.
 */
typedef struct EgDbSlot
{
	Oid			dboid;			/* InvalidOid when the slot is free */
	NameData	name;			/* as pg_database last said */
	EgDbState	state;			/* as a worker last found it */
	bool		recheck;		/* the extension may have changed: a worker is to look again */
	bool		present;		/* seen by the launcher's last look at pg_database */
	TimestampTz delivery_at;	/* the delivery workers are wanted from then on, on the workers' clock
								 * (eg_now()) (0: now; DT_NOEND: not) */
	TimestampTz upkeep_at;		/* the upkeep worker likewise */
	uint64		wakes;			/* commits in the database that asked for delivery */
	pid_t		hold_pid;		/* a backend whose DDL needs the database to itself (0: none) */
	bool		leave;			/* the workers are to finish what they sent and exit */
	TimestampTz turn_since;		/* when its workers last started */
	TimestampTz waiting_since;	/* wanted, but a worker slot was not free (0: not waiting) */
	TimestampTz last_active;	/* when one of its workers last had work */
	Latch	   *worker_latch[EG_MAX_DELIVERY_WORKERS];	/* index: worker number - 1 */
	pid_t		worker_pid[EG_MAX_DELIVERY_WORKERS];
	pid_t		upkeep_pid;		/* the upkeep worker's */
	Latch	   *upkeep_latch;
	bool		clean_exit[EG_MAX_DELIVERY_WORKERS + 1];	/* the last process of each left on purpose ([0]: upkeep) */
	bool		upkeep_wanted;	/* a delivery worker had work since the last upkeep */
	int64		backlog;		/* deliveries ready and not claimed, as the upkeep worker last counted */
	TimestampTz summary_at;		/* the upkeep worker's last summary of dead letters (0: none yet) */
	int64		summary_dead_letter_id; /* the newest dead letter then (-1: no baseline yet) */
	int64		summary_dropped;	/* the dropped events counted then */
	uint64		change_generation;	/* counts commits that created, paused, resumed, updated or dropped event subscriptions */
	bool		no_subscriptions;	/* the upkeep worker found no event subscription (and none changed since):
									 * commits that publish wake no delivery worker */
} EgDbSlot;

/*
 * Consumers waiting in eventgrid.receive() (queue event subscriptions, SPEC
 * 14) sleep on the condition variable their database and subscription
 * hash to (one of EG_QUEUE_CVS); a commit that made events of a
 * subscription receivable broadcasts on its subscription's, and so does the
 * end (commit or rollback) of a transaction that locked events of it with
 * receive() while consumers sleep because events they saw receivable were
 * held by another transaction (queue_held_waiters, per condition
 * variable).  A waiter is woken by its own subscription, and by another
 * only when both hash to one variable (1 in EG_QUEUE_CVS).  Not in the
 * database slots: a slot is cleared when it is taken again.
 */
#define EG_QUEUE_CVS 1024

/* Shared state: the launcher, the rate buckets, the hosts, the receivers' condition variables, and a slot per database. */
typedef struct EgShared
{
	slock_t		mutex;
	Latch	   *launcher_latch;
	pid_t		launcher_pid;
	bool		slots_short;	/* a database waits for a free worker slot: the others go as soon as they are idle */
	pg_atomic_uint64 publications_generation;	/* commits that changed eventgrid.table_publications, anywhere */
	EgRateBucket rate[EG_RATE_BUCKETS];
	EgHostSlot	hosts[EG_HOST_SLOTS];
	ConditionVariable queue_cv[EG_QUEUE_CVS];
	pg_atomic_uint32 queue_held_waiters[EG_QUEUE_CVS];
	pg_atomic_uint64 queue_wakes[EG_QUEUE_CVS];	/* broadcasts so far on each (eg_queue_wakes()) */
	int			ndb;			/* eventgrid.max_databases */
	EgDbSlot	db[FLEXIBLE_ARRAY_MEMBER];
} EgShared;

extern EgShared *eg_shared;

/*
 * The slot of the database this process is connected to, in a delivery or
 * upkeep worker (set at its start); NULL elsewhere.
 */
extern EgDbSlot *eg_my_db;

/* In a worker, the name of its database, which every line it logs names (the error hook, hooks.c). */
extern const char *eg_log_database;

/* settings.c: defines the GUCs (_PG_init) */
extern void eg_define_gucs(void);

/* pause.c: where tests hold a worker (eventgrid.debug_pause_points) */
#define EG_PAUSE_LOCK_CLASS 1162301520	/* the advisory lock's first key ("EGPP") */
extern void eg_pause_point(const char *name);

/*
 * databases.c: describes one of eventgrid's dynamic background workers: entry point
 * function, type "eventgrid <type>", database dboid (named dbname in its
 * name), worker number (1 to eventgrid.delivery_workers; 0 for the upkeep
 * worker, in bgw_extra), not restarted by the postmaster, reporting start
 * and exit to this process.
 */
extern void eg_worker_spec(BackgroundWorker *worker, const char *function, const char *type, Oid dboid,
						   const char *dbname, int number);

/*
 * databases.c: the database slots.  eg_db_wake() is what a commit that
 * published (or changed what the workers do) calls: the database's
 * delivery workers are woken, or, when none runs, the launcher starts them.
 */
extern Size eg_shared_size(void);
extern void eg_shared_init(void);
extern EgDbSlot *eg_db_find(Oid dboid, bool create);
extern void eg_db_wake(Oid dboid, bool delivery, bool upkeep);
/* A commit published events in database dboid: eg_db_wake() of both, no delivery worker while it has no event subscription. */
extern void eg_db_wake_for_events(Oid dboid);
extern void eg_db_extension_changed(Oid dboid);
extern void eg_db_hold_for_ddl(Oid dboid);
extern void eg_db_release_holds(bool dropped);
extern void eg_db_want(EgDbSlot *db, bool upkeep, TimestampTz at);
extern bool eg_db_leaving(void);

/* names.c: a topic's or domain topic's name, 3 to EG_TOPIC_NAME_MAX letters, digits and hyphens. */
#define EG_TOPIC_NAME_MAX 50
extern bool eg_is_topic_name(const char *s);
extern void eg_wake_launcher(void);

/* Wakes every delivery worker of this process's database now (no-op for those not running). */
extern void eg_wake_worker(void);

/*
 * commit.c: the commit callback, registered once per backend on first use;
 * what the transaction leaves for is told to it by the functions below.
 */
extern void eg_register_xact_callback(void);
/* CREATE, ALTER or DROP EXTENSION eventgrid: the launcher looks at the database again once this commits. */
extern void eg_extension_changed_at_commit(void);
/* DROP DATABASE ran: its slot is let go at commit. */
extern void eg_database_dropped_at_commit(void);
/* Wakes the delivery workers once when the current transaction commits. */
extern void eg_wake_worker_at_commit(void);

/*
 * Event subscriptions of this database changed (committed): the delivery
 * workers' generation counter moves, so they follow the change and their
 * next claim sweeps (store_claim_candidates.c).  No-op when not preloaded.
 */
extern void eg_subscriptions_changed(void);
/* Likewise for a transaction that publishes events: no delivery worker while the database has no event subscription. */
extern void eg_wake_for_events_at_commit(void);
/*
 * Wakes the consumers waiting in eventgrid.receive() for event subscription
 * sid of this database (-1: for every subscription of it) once the current
 * transaction commits.
 */
extern void eg_wake_receivers_at_commit(int64 sid);
/*
 * receive() locked events of subscription sid in the current transaction:
 * when it ends, committed or rolled back, the consumers of that
 * subscription that sleep on events held by a transaction
 * (eg_queue_held_waiters()) are woken.
 */
extern void eg_wake_receivers_at_end(int64 sid);
/* The condition variable consumers of subscription sid of database dboid wait on (NULL without shared_preload_libraries). */
extern ConditionVariable *eg_queue_cv(Oid dboid, int64 sid);
/* How many consumers of eg_queue_cv(dboid, sid) sleep on events another transaction holds (NULL when not preloaded). */
extern pg_atomic_uint32 *eg_queue_held_waiters(Oid dboid, int64 sid);
/*
 * How many broadcasts eg_queue_cv(dboid, sid) has had (NULL when not
 * preloaded): a waiter reads it before it looks at its queue, and sleeps
 * only if it has not moved once it is on the wait list.  (Its looks are
 * subtransactions, whose rollback takes it off the wait list.)
 */
extern pg_atomic_uint64 *eg_queue_wakes(Oid dboid, int64 sid);
/* Broadcasts on condition variable i of the receivers', counting it in eg_queue_wakes(). */
extern void eg_queue_broadcast(int i);
/* The index of the condition variable of subscription sid of database dboid. */
extern int	eg_queue_cv_index(Oid dboid, int64 sid);

/*
 * Table change publications (commit.c): a counter that moves when a commit
 * changed eventgrid.table_publications (in any database) or this backend
 * changed it (at once), so that table_change_trigger.c knows when what it
 * keeps of them is stale.
 */
extern uint64 eg_publications_generation(void);

/* Tells the upkeep worker of this process's database that work came in: upkeep within a second. */
extern void eg_want_upkeep(void);

/* Current time as the worker sees it: real time plus eventgrid.clock_offset. */
extern TimestampTz eg_now(void);
extern TimestampTz eg_transaction_now(void);

/* One event's JSON text, in the subscription's delivery schema (borrowed, not copied). */
typedef struct EgEventPart
{
	const char *json;
	int			len;
} EgEventPart;

static inline int
eg_cmp_int64(const void *a, const void *b)
{
	int64		x = *(const int64 *) a;
	int64		y = *(const int64 *) b;

	return x < y ? -1 : x > y ? 1 : 0;
}

/* Sorts values[0..n) and drops repeats; returns how many are left. */
static inline int
eg_sort_distinct_int64(int64 *values, int n)
{
	int			m = 0;

	qsort(values, n, sizeof(int64), eg_cmp_int64);
	for (int i = 0; i < n; i++)
		if (m == 0 || values[m - 1] != values[i])
			values[m++] = values[i];
	return m;
}

#endif							/* EVENTGRID_H */
