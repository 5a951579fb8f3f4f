/*
 * store.h - the delivery queue's SQL, behind a few functions per concern:
 *   store.c           units of work, the extension's presence and version,
 *                     statement preparation and the helpers the others share;
 *   store_claim.c     claiming first attempts (and store_claim_retries.c,
 *                     due retries; store_claim_cols.c, the request columns
 *                     both read);
 *   store_queue.c     queue subscriptions' events into their queue, expiry;
 *   store_auth.c      client certificates, delivery authentication and
 *                     destination credentials;
 *   store_record.c    requests in flight and recording outcomes and attempts;
 *   store_recovery.c  taking back what stopped workers left, and positions
 *                     restored from another cluster;
 *   store_rotation.c  emptying event tables and rotating the attempt history;
 *   store_counts.c    unmatched events, the backlog, dead-letter totals;
 *   store_health.c    endpoint health kept across runs (SPEC 6).
 * Each function runs in a unit of work opened by eg_store_begin() and closed
 * by eg_store_commit(); an ERROR aborts the unit, and the worker's loop
 * recovers.  Each statement sits beside the code that reads its result,
 * whose columns are named by an enum next to the SELECT.
 */
#ifndef EVENTGRID_STORE_H
#define EVENTGRID_STORE_H

#include "core/eventgrid.h"
#include "core/outcome.h"

#include "executor/spi.h"

/* Is the extension ready for the workers' statements? */
typedef enum EgReadiness
{
	EG_READY_UNKNOWN,
	EG_READY_OK,				/* installed, in this library's version */
	EG_READY_MISSING,			/* not installed in this database */
	EG_READY_VERSION			/* installed in another version */
} EgReadiness;

extern EgReadiness eg_store_readiness;
extern bool eg_store_quiet;
extern bool eg_store_begin(const char *activity);
extern void eg_store_commit(void);
extern void eg_store_no_flush_wait(void);

/*
 * One statement of the workers: its name (for errors), its SQL and
 * parameter types, whether it always takes the generic plan, and its plan
 * once prepared (kept across units of work, dropped when the extension
 * changes).
 */
typedef struct EgStatement
{
	const char *name;
	const char *sql;
	int			nargs;
	Oid			types[17];

	/*
	 * Always the generic plan: the plan cache otherwise planned some
	 * statements afresh at every call (their custom plans, sized by the
	 * arrays, looked cheaper), which cost about 0.7 ms per record of 1,000
	 * deliveries.
	 */
	bool		generic;

	/*
	 * Always a custom plan: one whose array parameter must be planned as
	 * the constant it is (its length estimated, its ANY a hash), whatever
	 * the plan cache would choose after five calls.
	 */
	bool		custom;
	SPIPlanPtr	plan;
	struct EgStatement *next_prepared;
} EgStatement;

/*
 * Runs st with args (none NULL, or as nulls says: 'n' for NULL, ' ' not);
 * an ERROR naming the statement unless SPI returns expected.  Every
 * statement takes a new snapshot, as each statement of a READ COMMITTED
 * transaction does: it sees what committed before it began and all its
 * unit of work wrote (docs/ARCHITECTURE.md, "Snapshots").  There is no
 * read-only mode: one statement run with the snapshot its unit began with
 * saw neither, and a claim once read an older snapshot than its scan's.
 */
extern void eg_store_run(EgStatement *st, Datum *args, int expected);
extern void eg_store_run_nulls(EgStatement *st, Datum *args, const char *nulls, int expected);

/* Helpers for SPI results and array parameters (store.c). */
extern char *eg_text_col(SPITupleTable *tt, int row, int col);
extern int32 eg_int32_col(SPITupleTable *tt, int row, int col, int32 dflt);
extern int64 eg_int64_col(SPITupleTable *tt, int row, int col, int64 dflt);
extern bool eg_bool_col(SPITupleTable *tt, int row, int col);
extern TimestampTz eg_timestamp_col(SPITupleTable *tt, int row, int col);
extern Datum eg_make_array(Datum *values, bool *nulls, int n, Oid elemtype);
extern Datum eg_int8_array(const int64 *values, int n);
/* An int8[] column of result row row as a palloc'd array (never NULL) of *n ids; NULL reads as none. */
extern int64 *eg_int8_array_col(SPITupleTable *tt, int row, int col, int *n);
extern Datum eg_xid8_array(const uint64 *values, int n);
extern Datum eg_text_array(const char *const *values, int n);
extern Oid	eg_store_table(const char *name);

/*
 * Ordering keys of result rows tt[0..n): args[0..2] become the int8 arrays
 * of the subscription ids, key hashes and retry ids in columns first,
 * first + 1 and first + 2 (of the rows whose boolean column keyed_col is
 * true, when keyed_col > 0), the arguments of eventgrid._park_ordering_keys,
 * _start_ordering_keys and _promote_ordering_keys; returns how many rows.
 */
extern int	eg_key_arrays(SPITupleTable *tt, int n, int first, int keyed_col, Datum *args);

/*
 * One claimed delivery: a first attempt (chunk > 0: an event reached by its
 * subscription's position, identified by its (txid, event_id) key) or a
 * retry (retry_id > 0: a row of eventgrid.retries).  Its texts live until
 * eg_store_commit().
 */
typedef struct EgClaimedRow
{
	int64		retry_id;
	int64		chunk;
	uint64		txid;
	int64		event_id;
	int64		subscription_id;	/* 0: a retry whose subscription is gone */
	int32		attempts;		/* attempts made before this claim */
	int32		max_attempts;
	EgProfile	profile;		/* delivery profile of the subscription */
	bool		expired;		/* time-to-live ran out before this attempt */
	const char *endpoint;
	const char *endpoint_type;	/* WebHook, RedisStream, StorageQueue or RabbitMQ (SPEC 21) */
	const char *subscription_name;
	const char *topic;			/* the subscription's topic */
	const char *schema;			/* delivery schema */
	int32		max_events_per_batch;	/* 0: not set */
	int32		preferred_batch_kb; /* 0: not set */
	EgEventPart payload;
	const char *output_event_id;
	const char *data_version;
	const char *metadata_version;
	const char *custom_headers; /* "Name: value" lines, or NULL */
	const char *signing_keys;	/* Standard Webhooks secrets, space-separated, or NULL */
	EgOutcomeCode prev_outcome; /* of the previous attempt */
	int32		prev_http_status;
	TimestampTz prev_attempted_at;	/* 0: none */
	int64		bytes;			/* event size, counted against max_bytes_in_flight */
	TimestampTz publish_time;	/* when the event was published */
	const char *source;			/* the logical replication subscription it came through, or NULL */
	TimestampTz client_cert_set_at; /* when its client certificate was set; 0: none */
	TimestampTz auth_set_at;	/* when its delivery authentication was set; 0: none */
	bool		ordered;		/* a first attempt of an ordered event subscription (SPEC 13) */
	bool		keyed;			/* ordered, and the event has a key (key_hash) */
	int64		key_hash;		/* hash of its ordering key, as eventgrid.retries.ordering_key_hash */
	const char *ordering_key;	/* the key itself (a broker message's key may be it), or NULL */
	bool		parked;			/* its key waits in the retries: it goes there too, unsent */
} EgClaimedRow;

/* The delivery authentication of an event subscription (eventgrid.delivery_authentications). */
struct EgAuthRow
{
	char	   *method;			/* oauth2 or entra */
	char	   *token_endpoint; /* oauth2's; NULL for entra */
	char	   *tenant_id;		/* entra's; NULL for oauth2 */
	char	   *client_id;
	char	   *client_secret;
	char	   *scope;			/* or NULL */
	char	   *audience;		/* or NULL */
	TimestampTz set_at;
};
typedef struct EgAuthRow EgAuthRow;

/*
 * store_claim_candidates.c: the positions a claim looks at (SPEC 20), each
 * list sorted: the push subscriptions' (claimed) and the queue ones'
 * (transferred).  swept: the discovery looked at every read key with events.
 */
typedef struct EgClaimCandidates
{
	int64	   *push;
	int			npush;
	int64	   *queue;
	int			nqueue;
	bool		swept;
} EgClaimCandidates;

/*
 * How much a first-attempt claim reads (eg_store_claim_first()): at most
 * rows_per_position events of each position, of at most positions
 * positions, taken in turn (the least recently served first); it says how
 * many positions had events (busy) and how many events it read of them
 * (scanned).
 */
typedef struct EgClaimSize
{
	int			rows_per_position;
	int			positions;
	int			busy;
	int			scanned;
} EgClaimSize;

/*
 * The candidates of a claim, in its unit of work, before anything else of
 * it: positions whose read key has events the last discovery's snapshot
 * did not see, and those kept since (a sweep: every read key with events in
 * the event tables); not held, of this cluster, not leased by another
 * worker than lease_owner.  now: the worker's clock (a sweep at least every
 * 2 s).
 */
extern void eg_store_claim_candidates(int lease_owner, TimestampTz now, EgClaimCandidates *c);

/*
 * The next claim looks at the position of subscription_id (a queue
 * subscription's when queue: transferred, not claimed), whatever its
 * events.
 */
extern void eg_store_claim_keep(int64 subscription_id, bool queue);

/*
 * The next claim sweeps: after an ERROR in a unit of work (what was kept
 * may be lost), and when event subscriptions were created, changed or
 * resumed, or an endpoint validated.
 */
extern void eg_store_claim_sweep(void);

/* store_claim.c */
extern int	eg_store_claim_retries(TimestampTz now, int limit, int64 byte_budget, int lease_owner,
								   int64 lease_ms, EgClaimedRow **rows);
extern int	eg_store_claim_first(TimestampTz now, EgClaimSize *size, int64 byte_budget, int lease_owner,
								 const EgClaimCandidates *cand, const int64 *skip, int nskip,
								 int64 *next_chunk, EgClaimedRow **rows, bool *more, bool *locked);
extern TimestampTz eg_store_next_due(void);
extern void eg_store_analyze(void);
/*
 * store_queue.c: queue subscriptions' new events into their queue (a
 * delivery worker's claim), expired events to dead letters (the upkeep
 * worker)
 */
extern int64 eg_store_transfer_positions(TimestampTz now, const EgClaimCandidates *cand, bool *locked);
extern int64 eg_store_expire_queue(TimestampTz now);
/* store_auth.c */
extern bool eg_store_client_certificate(int64 sub_id, char **cert, char **key, TimestampTz *set_at);
extern bool eg_store_destination_credentials(int64 sub_id, char **kind, char **user, char **secret);
extern bool eg_store_delivery_authentication(int64 sub_id, EgAuthRow *row);
extern void eg_auth_row_cols(SPITupleTable *tt, int row, int first, EgAuthRow *a);

/* The outcome of one delivery, as recorded. */
typedef struct EgOutcome
{
	int64		retry_id;		/* 0: a first attempt, keyed by subscription, txid, event_id */
	int64		subscription_id;
	uint64		txid;
	int64		event_id;
	EgAction	action;
	EgOutcomeCode outcome;		/* last outcome; EG_OUTCOME_NONE if never attempted */
	int32		http_status;	/* 0: none */
	bool		attempted;		/* an attempt was made in this round */
	int32		attempts_after;
	TimestampTz attempted_at;	/* 0: none */
	TimestampTz next_at;		/* when action is EG_ACTION_RETRY */
	EgFinalReason reason;		/* when action is EG_ACTION_FINAL */
	/* for the metrics' histograms (store_metrics.c) */
	TimestampTz publish_time;	/* when the event was published */
	double		duration_ms;	/* the attempt's request took this long; < 0: no HTTP answer */
	bool		request_head;	/* the first event of its request: the request is observed once */
} EgOutcome;

/* store_metrics.c */
extern void eg_store_record_metrics(EgOutcome *const *outcomes, int n);

/*
 * One delivery attempt as the history keeps it: one HTTP request (or one
 * held back by probation), with the ids of every event it carried.
 */
typedef struct EgAttempt
{
	TimestampTz attempted_at;
	int64		subscription_id;
	const char *subscription_name;
	const char *topic;			/* the subscription's topic */
	const int64 *event_ids;
	int			nevents;
	int32		attempt;		/* 1-based; a batch: its first event's */
	int32		http_status;	/* 0: no HTTP answer */
	EgOutcomeCode outcome;
	double		duration_ms;	/* < 0: not sent */
	const char *error;			/* transport error text, or NULL */
	const char *response_body;	/* a failed answer's first bytes, printable, or NULL */
	const char *const *event_sources;	/* each event's source (NULL: published here), or NULL: none has one */
} EgAttempt;

/* How far a chunk's first attempts have been handed to HTTP. */
typedef struct EgChunkMark
{
	int64		chunk;
	uint64		txid;
	int64		event_id;
} EgChunkMark;

/* store_record.c */
extern void eg_store_mark_in_flight(int lease_owner, int64 wave, const int64 *retry_ids, int nretries,
									const EgChunkMark *marks, int nmarks);
extern void eg_store_forget_waves(int lease_owner, const int64 *waves, int n);
extern TimestampTz eg_store_record(EgOutcome *const *outcomes, int n, int lease_owner,
								   const int64 *chunks, int nchunks,
								   const EgAttempt *attempts, int nattempts);

/* store_recovery.c */
extern void eg_store_recover(int starting_pid, TimestampTz now, bool history,
							 uint64 *charged, uint64 *released);
extern uint64 eg_store_rebase(TimestampTz now);

/* store_rotation.c */
extern char *eg_store_truncate(int event_table, TimestampTz now);
extern bool eg_store_table_used(int event_table);
extern void eg_store_note_replication_slots(TimestampTz now);

/* Moves the positions of subscriptions whose endpoint validation failed past what was published since. */
extern void eg_store_pass_failed(TimestampTz now);
extern char *eg_store_rotate_history(TimestampTz now, int64 period_ms, int64 max_rows);

/* store_counts.c */
#define EG_BACKLOG_COUNT_LIMIT 100000	/* the backlog is counted up to this */
extern int64 eg_store_backlog(TimestampTz now);
extern int64 eg_store_pauses(bool *all);

/* What the claims would do with an event subscription now (eg_store_subscription_states). */
typedef struct EgSubscriptionState
{
	int64		id;
	bool		gone;			/* dropped */
	bool		held;			/* paused, or its endpoint not validated */
	const char *endpoint;		/* NULL when gone */
} EgSubscriptionState;
extern void eg_store_subscription_states(const int64 *ids, int n, EgSubscriptionState *states);
extern void eg_store_count_unmatched(void);
extern void eg_store_refresh_receive_grants(void);
extern bool eg_store_has_subscriptions(void);

/*
 * When a database's workers are next wanted, on the workers' clock
 * (DT_NOEND: not until work comes): its delivery workers (work waiting at
 * a position, chunks left in flight, the next due retry), its upkeep
 * worker (validations, the attempt history's rotation by age, event
 * subscriptions' expiration).
 */
extern TimestampTz eg_store_delivery_wanted(TimestampTz now);
extern TimestampTz eg_store_upkeep_due(TimestampTz now, int64 history_period_ms);

/* Events dead-lettered and dropped so far (eg_store_finals). */
typedef struct EgFinals
{
	int64		last_dead_letter_id;	/* highest dead letter id */
	int64		dropped;		/* sum of the subscriptions' dropped counters */
	char	   *by_reason;		/* "reason n, ..." of dead letters after the given id, or NULL */
	int64		dead_lettered;	/* how many dead letters after the given id */
} EgFinals;
extern EgFinals eg_store_finals(int64 after_dead_letter_id);
extern int	eg_store_expiring_certificates(TimestampTz before, char ***topics, char ***names,
										   TimestampTz **not_after);
/* An event subscription whose expiration_time has come (SPEC 17). */
typedef struct EgExpired
{
	char	   *topic;			/* its read key: topic, or domain/topic */
	char	   *name;
	TimestampTz expired_at;
	int64		owed;			/* events it still owed: dead-lettered or dropped */
	bool		skipped;		/* locked elsewhere or in flight: tried again later */
} EgExpired;

/*
 * Drops expired event subscriptions (SPEC 17) after dead-lettering what
 * they owed; returns how many it looked at (at most 1000), in *expired
 * (valid until the unit of work ends), and the next expiration (DT_NOEND:
 * none; a skipped one's is past).
 */
extern int	eg_store_drop_expired(EgExpired **expired, TimestampTz *next);

/* Health of one endpoint URL, as kept in eventgrid.endpoint_states. */
typedef struct EgHealth
{
	const char *endpoint;
	const char *state;			/* healthy, probation or probing */
	int32		consecutive_failures;
	EgOutcomeCode last_failure_outcome; /* EG_OUTCOME_NONE: none */
	EgOutcomeCode probation_cause;	/* EG_OUTCOME_NONE: healthy */
	TimestampTz probation_started_at;	/* 0: healthy */
	TimestampTz probation_until;	/* 0: healthy */
	int32		probations;		/* in a row since the last success */
} EgHealth;

/* store_health.c */
extern int	eg_store_load_health(EgHealth **rows);
extern void eg_store_save_health(const EgHealth *rows, int n, TimestampTz now);
extern void eg_store_forget_health(void);

/* store_validation.c: the endpoint validations due, and their outcomes (delivery/validation.c sends them) */
typedef struct EgValidation
{
	int64		subscription_id;
	char	   *topic;
	char	   *name;			/* the event subscription's */
	char	   *code;			/* the validation code sent */
	char	   *endpoint;
	bool		cloudevents;	/* the CloudEvents OPTIONS request, else a SubscriptionValidationEvent */
	char	   *body;			/* the SubscriptionValidationEvent (JSON array text) */
	char	   *headers;		/* static custom headers, "Name: value" lines, or NULL */
	int			rate;			/* max_events_per_second, 0: none */
	char	   *client_cert;	/* PEM certificate (and chain) presented over HTTPS, or NULL */
	char	   *client_key;		/* its PEM private key, or NULL */
	struct EgAuthRow *auth;		/* its delivery authentication (bearer tokens), or NULL */
	/* the answer */
	int			http_status;	/* 0: none */
	char	   *answer_body;	/* its first bytes, printable ASCII */
	char	   *allowed_origin; /* WebHook-Allowed-Origin, or NULL */
	char	   *allowed_rate;	/* WebHook-Allowed-Rate, or NULL */
	char	   *error;			/* libcurl's message when there was no answer, or NULL */
} EgValidation;

extern int	eg_store_due_validations(TimestampTz now, int limit, MemoryContext cxt, EgValidation **rows,
									 int64 *pending);
/* Records an answer; returns the new provisioning state, or NULL when the validation changed meanwhile. */
extern char *eg_store_record_validation(const EgValidation *v, const char *origin);


/*
 * Runs work(arg) in a subtransaction of the current transaction (store.c):
 * NULL when it returned, else the ERROR it raised, copied into the
 * caller's memory context, the subtransaction rolled back and the error
 * dropped; the caller's memory context and resource owner are kept.
 */
extern ErrorData *eg_try(void (*work) (void *arg), void *arg);

#endif							/* EVENTGRID_STORE_H */
