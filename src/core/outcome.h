/*
 * outcome.h - what one delivery attempt came to and what follows from it
 * (SPEC sections 3, 4, 6 and 7): outcomes, verdicts, the retry schedules of
 * both delivery profiles, probation lengths, and the rules that end a
 * delivery without an attempt (time-to-live, attempts used up).  Pure
 * functions of their arguments (outcome.c); names are made only at the SQL
 * and log boundary.
 */
#ifndef EVENTGRID_OUTCOME_H
#define EVENTGRID_OUTCOME_H

#include "core/eventgrid.h"

/* How a request ended, before its HTTP status is looked at. */
typedef enum EgTransport
{
	EG_TRANSPORT_OK = 0,		/* an HTTP response arrived */
	EG_TRANSPORT_TIMEOUT,		/* no answer within eventgrid.response_timeout */
	EG_TRANSPORT_RESOLVE,		/* DNS resolution failed */
	EG_TRANSPORT_SOCKET,		/* refused, reset, TLS or other network error */
	EG_TRANSPORT_HELD,			/* not sent: the endpoint is on probation (SPEC 6) */
	EG_TRANSPORT_TOKEN			/* not sent: no bearer token could be had (SPEC 12) */
} EgTransport;

/*
 * lastDeliveryOutcome (SPEC 3), plus Delivered, GenericError (a status the
 * contract's table does not name), Aborted (a crash came between sending
 * and recording) and InvalidHeader (a request that may not be sent).
 * EG_OUTCOME_NONE: no attempt was ever made.
 */
typedef enum EgOutcomeCode
{
	EG_OUTCOME_NONE = 0,
	EG_OUTCOME_DELIVERED,
	EG_OUTCOME_NOT_FOUND,
	EG_OUTCOME_DISABLED,
	EG_OUTCOME_FULL,
	EG_OUTCOME_UNAUTHORIZED,
	EG_OUTCOME_BAD_REQUEST,
	EG_OUTCOME_TIMED_OUT,
	EG_OUTCOME_BUSY,
	EG_OUTCOME_PAYLOAD_TOO_LARGE,
	EG_OUTCOME_PROBATION,
	EG_OUTCOME_CANCELED,
	EG_OUTCOME_ABORTED,
	EG_OUTCOME_SOCKET_ERROR,
	EG_OUTCOME_RESOLUTION_ERROR,
	EG_OUTCOME_FORBIDDEN,
	EG_OUTCOME_GENERIC_ERROR,
	EG_OUTCOME_INVALID_HEADER,
	EG_OUTCOME_INVALID_ENCODING,
	EG_OUTCOME_COUNT
} EgOutcomeCode;

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

/*
 * What happens to a delivery.  The values are the letters the record
 * statements take (store_record.c), so no name is looked up per row.
 */
typedef enum EgAction
{
	EG_ACTION_UNDECIDED = 0,
	EG_ACTION_DELIVERED = 'd',
	EG_ACTION_RETRY = 'r',
	EG_ACTION_FINAL = 'f',		/* dead-lettered, or dropped without dead-lettering */
	EG_ACTION_GONE = 'u',		/* its event subscription was dropped */
	EG_ACTION_WAIT = 'w'		/* of an ordered subscription, not attempted: waits in the retries
								 * behind an earlier event of its key that did not get through */
} EgAction;

/* Why a delivery ended undelivered: deadLetterReason (SPEC 7). */
typedef enum EgFinalReason
{
	EG_REASON_NONE = 0,
	EG_REASON_TTL,				/* TimeToLiveExceeded */
	EG_REASON_MAX_ATTEMPTS,		/* MaxDeliveryAttemptsExceeded */
	EG_REASON_NON_RETRIABLE		/* NonRetriableError */
} EgFinalReason;

extern const char *eg_outcome_name(EgOutcomeCode code);
extern EgOutcomeCode eg_outcome_parse(const char *name);
extern const char *eg_reason_name(EgFinalReason reason);

extern bool eg_status_is_success(int http_status);
extern EgOutcomeCode eg_outcome_of(EgTransport transport, int http_status);
extern EgVerdict eg_verdict(EgProfile profile, EgTransport transport, int http_status);
extern int64 eg_retry_delay_ms(EgProfile profile, int failed_attempt, int http_status);

/* Delayed delivery (SPEC 6): probations grow to at most this long. */
#define EG_MAX_PROBATION_MS ((int64) 4 * 60 * 60 * 1000)
extern int64 eg_probation_ms(EgOutcomeCode outcome, int probation);

/* What happens to a delivery after one attempt (eg_decide). */
typedef struct EgDecision
{
	EgAction	action;
	EgOutcomeCode outcome;		/* lastDeliveryOutcome of the attempt */
	int32		http_status;	/* 0: no HTTP answer */
	int32		attempts_after; /* attempts made, this one included */
	EgFinalReason reason;		/* when action is EG_ACTION_FINAL */
	int64		delay_ms;		/* until the next attempt when action is EG_ACTION_RETRY */
} EgDecision;

extern EgDecision eg_decide(EgProfile profile, int attempts_before, int max_attempts,
							EgTransport transport, int http_status, int jitter_percent,
							double random_fraction, int64 retry_after_ms);

/*
 * Whether a claimed delivery may be attempted now: EG_ACTION_UNDECIDED if
 * so, else how it ends without an attempt (*reason says why): its
 * subscription is gone, its time-to-live ran out (checked only when an
 * attempt comes due, SPEC 4), or its attempts are used up.
 */
extern EgAction eg_before_attempt(bool subscription_gone, bool expired, int attempts, int max_attempts,
								  EgFinalReason *reason);

#endif							/* EVENTGRID_OUTCOME_H */
