/*
 * eventgrid.h - declarations shared by the eventgrid extension's C files:
 * GUC variables, the small shared-memory block through which publishing
 * backends wake the delivery worker, the launcher and worker entry points,
 * the pure retry/outcome functions of retry.c, the queue's SQL in
 * queue.c, the body builder of payload.c, the header checks of request.c
 * and the libcurl wrapper of http.c.
 */
#ifndef EVENTGRID_H
#define EVENTGRID_H

#include "postgres.h"

#include "datatype/timestamp.h"
#include "postmaster/bgworker.h"
#include "lib/stringinfo.h"
#include "storage/latch.h"
#include "storage/spin.h"

/* SPEC section 3, 4, 5 and 8 limits. */
#define EG_MAX_EVENT_BYTES (1024 * 1024)
#define EG_MAX_DELIVERY_ATTEMPTS 30
#define EG_MAX_DELIVERY_COUNT 10	/* namespace topics */

/* Set by the Makefile from eventgrid.control; the worker compares it with the schema's. */
#ifndef EG_VERSION
#error "EG_VERSION must be defined"
#endif

/* GUCs (eventgrid.c) */
extern char *eg_database_name;
extern int	eg_delivery_workers;
extern int	eg_max_concurrent_requests;
#define EG_MAX_CONCURRENT_REQUESTS_LIMIT 1000	/* upper bound of eventgrid.max_concurrent_requests */
extern int	eg_response_timeout_ms;
extern int	eg_retry_jitter_percent;
extern int	eg_clock_offset_s;
extern int	eg_default_max_events_per_batch;
extern int	eg_default_preferred_batch_kb;
extern bool eg_delivery_paused;
extern int	eg_max_bytes_in_flight_kb;
extern int	eg_event_table_rotation_s;
extern int	eg_max_requests_per_endpoint;
extern int	eg_probation_failures;
extern int	eg_attempt_history;
extern int	eg_attempt_history_retention_s;
extern int	eg_attempt_history_max_rows;

/* eventgrid.attempt_history: which delivery attempts the history keeps. */
typedef enum EgHistoryMode
{
	EG_HISTORY_ALL,
	EG_HISTORY_FAILURES,
	EG_HISTORY_OFF
} EgHistoryMode;

/* Delivery attempt history: three tables that take turns (queue.c). */
#define EG_HISTORY_TABLES 3

/* Published events go to three event tables that take turns (eventgrid.c). */
#define EG_EVENT_TABLES 3
extern int	eg_event_table_at(TimestampTz ts);

/*
 * Most delivery workers eventgrid.delivery_workers may ask for.  Worker k
 * (1 to eventgrid.delivery_workers) has entry k - 1 of the arrays below;
 * what it claims is leased to its pid (lease_owner).
 */
#define EG_MAX_DELIVERY_WORKERS 8

/* Shared state: the delivery workers' latches, set by publishers at commit. */
typedef struct EgShared
{
	slock_t		mutex;
	Latch	   *worker_latch[EG_MAX_DELIVERY_WORKERS];	/* index: worker number - 1 */
	pid_t		worker_pid[EG_MAX_DELIVERY_WORKERS];
	bool		upkeep_wanted;	/* a delivery worker had work since the last upkeep */
	int64		backlog;		/* deliveries ready and not claimed, as the upkeep worker last counted */
} EgShared;

extern EgShared *eg_shared;

/*
 * Entry points.  The launcher (launcher.c) is registered from _PG_init; it
 * waits for eventgrid.database_name to exist and starts the delivery worker
 * (worker.c) there, restarting it with backoff when it exits.
 */
extern PGDLLEXPORT void eventgrid_launcher_main(Datum arg);
extern PGDLLEXPORT void eventgrid_worker_main(Datum arg);
extern PGDLLEXPORT void eventgrid_upkeep_main(Datum arg);

/*
 * Describes one of eventgrid's dynamic background workers: entry point
 * function, type (also its name) "eventgrid <type>", database dboid, worker
 * number (1 to eventgrid.delivery_workers; 0 for the upkeep worker, in
 * bgw_extra), not restarted by the postmaster, reporting start and exit to
 * this process.
 */
extern void eg_worker_spec(BackgroundWorker *worker, const char *function, const char *type, Oid dboid,
						   int number);

/* Wakes every delivery worker now (no-op for those not running). */
extern void eg_wake_worker(void);

/* Current time as the worker sees it: real time plus eventgrid.clock_offset. */
extern TimestampTz eg_now(void);

/*
 * retry.c: outcome classification and the retry schedule (SPEC 3 and 4).
 * Pure functions of their arguments.
 */
typedef enum EgTransport
{
	EG_TRANSPORT_OK = 0,		/* an HTTP response arrived */
	EG_TRANSPORT_TIMEOUT,		/* no answer within eventgrid.response_timeout */
	EG_TRANSPORT_RESOLVE,		/* DNS resolution failed */
	EG_TRANSPORT_SOCKET,		/* refused, reset, TLS or other network error */
	EG_TRANSPORT_HELD			/* not sent: the endpoint is on probation (SPEC 6) */
} EgTransport;

typedef enum EgVerdict
{
	EG_VERDICT_DELIVERED,		/* success: 200-204 */
	EG_VERDICT_RETRY,			/* failed, retry per schedule */
	EG_VERDICT_NO_RETRY			/* failed, dead-letter or drop at once */
} EgVerdict;

/* The delivery profile of a subscription: its topic's topic_type. */
typedef enum EgProfile
{
	EG_PROFILE_CUSTOM,			/* custom topics (SPEC 3, 4) */
	EG_PROFILE_NAMESPACE		/* namespace topics (SPEC 4) */
} EgProfile;

extern bool eg_status_is_success(int http_status);
extern const char *eg_outcome_name(EgTransport transport, int http_status);
extern EgVerdict eg_verdict(EgProfile profile, EgTransport transport, int http_status);
extern int64 eg_retry_delay_ms(EgProfile profile, int failed_attempt, int http_status);

/* Delayed delivery (SPEC 6): probations grow to at most this long. */
#define EG_MAX_PROBATION_MS ((int64) 4 * 60 * 60 * 1000)
extern int64 eg_probation_ms(const char *outcome, int probation);

/* What happens to a delivery after one attempt (eg_decide). */
typedef struct EgDecision
{
	char		action;			/* d delivered, r retry, f final failure */
	const char *outcome;		/* lastDeliveryOutcome of the attempt */
	int32		http_status;	/* 0: no HTTP answer */
	int32		attempts_after; /* attempts made, this one included */
	const char *reason;			/* dead-letter reason when action is f */
	int64		delay_ms;		/* until the next attempt when action is r */
} EgDecision;

extern EgDecision eg_decide(EgProfile profile, int attempts_before, int max_attempts,
							EgTransport transport, int http_status, int jitter_percent,
							double random_fraction);

/*
 * queue.c: the delivery queue's SQL behind a few functions.  Each runs in a
 * unit of work opened by eg_queue_begin() and closed by eg_queue_commit();
 * an ERROR aborts the unit, and the caller's loop recovers.
 */
typedef enum EgReadiness
{
	EG_READY_UNKNOWN,
	EG_READY_OK,				/* installed, in this library's version */
	EG_READY_MISSING,			/* not installed in this database */
	EG_READY_VERSION			/* installed in another version */
} EgReadiness;

typedef struct EgEventPart
{
	const char *json;			/* event as JSON text, in the delivery schema */
	int			len;
} EgEventPart;

/*
 * One claimed delivery: a first attempt (chunk > 0: an event reached by its
 * subscription's position, identified by its (txid, event_id) key) or a
 * retry (retry_id > 0: a row of eventgrid.retries).  Its texts live until
 * eg_queue_commit().
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
	const char *prev_outcome;	/* of the previous attempt, or NULL */
	int32		prev_http_status;
	TimestampTz prev_attempted_at;	/* 0: none */
	int64		bytes;			/* event size, counted against max_bytes_in_flight */
} EgClaimedRow;

/* The outcome of one delivery, as recorded. */
typedef struct EgOutcome
{
	int64		retry_id;		/* 0: a first attempt, keyed by subscription, txid, event_id */
	int64		subscription_id;
	uint64		txid;
	int64		event_id;
	char		action;			/* d delivered, r retry, f final failure, u subscription gone */
	const char *outcome;		/* last outcome; NULL if never attempted */
	int32		http_status;	/* 0: none */
	bool		attempted;		/* an attempt was made in this round */
	int32		attempts_after;
	TimestampTz attempted_at;	/* 0: none */
	TimestampTz next_at;		/* when action is r */
	const char *reason;			/* dead-letter reason when action is f */
} EgOutcome;

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
	const char *outcome;
	double		duration_ms;	/* < 0: not sent */
	const char *error;			/* transport error text, or NULL */
} EgAttempt;

/* How far a chunk's first attempts have been handed to HTTP. */
typedef struct EgChunkMark
{
	int64		chunk;
	uint64		txid;
	int64		event_id;
} EgChunkMark;

extern EgReadiness eg_queue_readiness;
extern bool eg_queue_quiet;
extern bool eg_queue_begin(const char *activity);
extern void eg_queue_commit(void);
extern void eg_queue_no_flush_wait(void);
extern int	eg_queue_claim_retries(TimestampTz now, int limit, int64 byte_budget, int lease_owner,
								   int64 lease_ms, EgClaimedRow **rows);
extern int	eg_queue_claim_first(TimestampTz now, int limit, int64 byte_budget, int lease_owner,
								 const int64 *skip, int nskip,
								 int64 *next_chunk, EgClaimedRow **rows, bool *more, bool *locked);
extern void eg_queue_analyze(void);
extern void eg_queue_mark_in_flight(int lease_owner, int64 wave, const int64 *retry_ids, int nretries,
									const EgChunkMark *marks, int nmarks);
extern void eg_queue_forget_waves(int lease_owner, const int64 *waves, int n);
extern TimestampTz eg_queue_record(EgOutcome *const *outcomes, int n, int lease_owner,
								   const int64 *chunks, int nchunks,
								   const EgAttempt *attempts, int nattempts);
extern TimestampTz eg_queue_next_due(void);
extern void eg_queue_recover(int starting_pid, TimestampTz now, bool history,
							 uint64 *charged, uint64 *released);
extern char *eg_queue_rotate_history(TimestampTz now, int64 period_ms, int64 max_rows);
#define EG_BACKLOG_COUNT_LIMIT 100000	/* the backlog is counted up to this */
extern int64 eg_queue_backlog(TimestampTz now);

/* Events dead-lettered and dropped so far (eg_queue_finals). */
typedef struct EgFinals
{
	int64		last_dead_letter_id;	/* highest dead letter id */
	int64		dropped;		/* sum of the subscriptions' dropped counters */
	char	   *by_reason;		/* "reason n, ..." of dead letters after the given id, or NULL */
	int64		dead_lettered;	/* how many dead letters after the given id */
} EgFinals;
extern EgFinals eg_queue_finals(int64 after_dead_letter_id);
extern uint64 eg_queue_rebase(TimestampTz now);
extern void eg_queue_count_unmatched(void);
extern char *eg_queue_truncate(int event_table, TimestampTz now);
extern bool eg_queue_table_used(int event_table);
struct EgHealth;
extern int	eg_queue_load_health(struct EgHealth **rows);
extern void eg_queue_save_health(const struct EgHealth *rows, int n, TimestampTz now);
extern void eg_queue_forget_health(void);

/*
 * payload.c: builds the HTTP request for a batch of events of one
 * subscription (SPEC 5 and 8).
 */
extern const char *eg_content_type(const char *delivery_schema, int nevents);
extern void eg_build_body(StringInfo buf, const char *delivery_schema,
						  const EgEventPart *events, int nevents);
extern int	eg_batch_take(const EgEventPart *events, int nevents,
						  int max_events, int64 max_bytes);

/*
 * request.c: HTTP header lines.  eg_header_problem() returns NULL when
 * "name: value" may be sent, else why not (a name that is not an HTTP token,
 * a control character, a name that changes HTTP framing or routing).
 */
extern const char *eg_header_problem(const char *name, const char *value, bool custom);
extern int	eg_control_char_at(const char *s, int len);

/* What the headers of one request say (the first event's values for a batch). */
typedef struct EgRequestSpec
{
	const char *schema;			/* delivery schema */
	const char *subscription_name;
	int			delivery_count; /* attempts made before this one */
	const char *metadata_version;
	const char *data_version;
	const char *output_event_id;
	const char *custom_headers; /* "Name: value" lines separated by '\n', or NULL */
} EgRequestSpec;

struct EgRequest;
extern bool eg_request_build(struct EgRequest *req, const EgRequestSpec *spec,
							 const EgEventPart *events, int nevents, StringInfo scratch);

/* http.c: libcurl multi interface on its own thread, many requests in flight. */
typedef struct EgRequest
{
	const char *url;
	long		timeout_ms;
	void	   *easy;			/* CURL * */
	struct curl_slist *headers;
	char	   *body;			/* malloc'd, freed when the request ends */
	size_t		body_len;
	char		errbuf[256];
	/* results */
	EgTransport transport;
	int			http_status;
	double		duration_ms;	/* libcurl's total time of the transfer */
	/* caller's bookkeeping */
	void	  **items;			/* the rows this request carries */
	int			count;
	int64		subscription_id;
	const char *subscription_name;
	const char *topic;			/* the subscription's topic */
	int64		bytes;			/* event bytes carried */
	struct EgTarget *target;	/* its endpoint (endpoint.c) */
	bool		probe;			/* sent to end its endpoint's probation */
	TimestampTz started_at;
	struct EgRequest *next;
} EgRequest;

extern const char *eg_endpoint_problem(const char *url);

/*
 * endpoint.c: a fair queue of requests per endpoint host and the health of
 * each endpoint URL (SPEC 6, delayed delivery).
 */
typedef struct EgTarget EgTarget;

/* Health of one endpoint URL, as kept in eventgrid.endpoint_states. */
typedef struct EgHealth
{
	const char *endpoint;
	const char *state;			/* healthy, probation or probing */
	int32		consecutive_failures;
	const char *last_failure_outcome;	/* NULL: none */
	const char *probation_cause;	/* NULL: healthy */
	TimestampTz probation_started_at;	/* 0: healthy */
	TimestampTz probation_until;	/* 0: healthy */
	int32		probations;		/* in a row since the last success */
} EgHealth;

extern EgTarget *eg_target(const char *url);
extern const char *eg_target_url(const EgTarget *t);
extern TimestampTz eg_target_probation_until(const EgTarget *t);
extern void eg_target_queue(EgRequest *req);
extern EgRequest *eg_target_next(TimestampTz now, bool may_send, bool *hold);
extern void eg_target_unsend(EgRequest *req);
extern bool eg_target_finished(EgRequest *req, TimestampTz now);
extern int	eg_targets_queued(void);
extern void eg_targets_waiting(int *ready, int64 *backed_up_bytes);
extern int	eg_targets_skip_list(int64 **subs);
extern bool eg_targets_unblocked(void);
extern int	eg_targets_dirty(EgHealth **out);
extern void eg_targets_written(const EgHealth *written, int n);
extern void eg_targets_load(const EgHealth *rows, int n);
extern void eg_http_init(void);
extern void eg_http_set_max_connections(long n);
extern void eg_http_shutdown(void);
extern void eg_http_start(EgRequest **reqs, int n, long timeout_ms);
extern void eg_http_set_headers(EgRequest *req, const char *lines, size_t len, int n);
extern void eg_http_free_headers(EgRequest *req);
extern int	eg_http_in_flight(void);
extern void eg_http_wait(int want, int timeout_ms);
extern EgRequest *eg_http_take_finished(void);

#endif							/* EVENTGRID_H */
