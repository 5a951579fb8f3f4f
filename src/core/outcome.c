/*
 * outcome.c - outcome classification, the retry schedules of Event Grid's
 * two delivery profiles, probation lengths, and the decisions before and
 * after each attempt (SPEC sections 3, 4, 6 and 7).  Pure functions with no
 * I/O: the delivery worker calls eg_before_attempt() and eg_decide(), the
 * endpoint health eg_probation_ms(), and eventgrid.retry_delay(),
 * eventgrid.delivery_outcome() and eventgrid.probation_duration() expose
 * them to SQL for users and tests.  Outcomes are an enum everywhere; their
 * names (the contract's lastDeliveryOutcome) are made only here.
 */
#include "core/outcome.h"

#include "fmgr.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

/* Custom topics: delay after failed attempt #n (1-based); the last step repeats. */
static const int eg_schedule_s[] = {
	10, 30, 60, 5 * 60, 10 * 60, 30 * 60, 60 * 60, 3 * 60 * 60, 6 * 60 * 60, 12 * 60 * 60
};

/*
 * Namespace topics: retries at these offsets from the first attempt, then
 * every 5 minutes (SPEC 4).  Event Grid's page reads "0 s (immediate retry), 10 s,
 * 30 s, 1 min, 5 min"; its worked example (attempts at 0 s, 10 s, 30 s,
 * 1 min, 5 min, 10 min, 15 min, 20 min) only agrees when the 0 s is the
 * first attempt itself and the times are offsets from it, so that is the
 * reading: after failed attempt #n the worker waits offset[n] - offset[n-1].
 */
static const int eg_namespace_offsets_s[] = {0, 10, 30, 60, 5 * 60};

/* lastDeliveryOutcome names, indexed by EgOutcomeCode. */
static const char *const outcome_names[EG_OUTCOME_COUNT] = {
	[EG_OUTCOME_NONE] = NULL,
	[EG_OUTCOME_DELIVERED] = "Delivered",
	[EG_OUTCOME_NOT_FOUND] = "NotFound",
	[EG_OUTCOME_DISABLED] = "Disabled",
	[EG_OUTCOME_FULL] = "Full",
	[EG_OUTCOME_UNAUTHORIZED] = "Unauthorized",
	[EG_OUTCOME_BAD_REQUEST] = "BadRequest",
	[EG_OUTCOME_TIMED_OUT] = "TimedOut",
	[EG_OUTCOME_BUSY] = "Busy",
	[EG_OUTCOME_PAYLOAD_TOO_LARGE] = "PayloadTooLarge",
	[EG_OUTCOME_PROBATION] = "Probation",
	[EG_OUTCOME_CANCELED] = "Canceled",
	[EG_OUTCOME_ABORTED] = "Aborted",
	[EG_OUTCOME_SOCKET_ERROR] = "SocketError",
	[EG_OUTCOME_RESOLUTION_ERROR] = "ResolutionError",
	[EG_OUTCOME_FORBIDDEN] = "Forbidden",
	[EG_OUTCOME_GENERIC_ERROR] = "GenericError",
	[EG_OUTCOME_INVALID_HEADER] = "InvalidHeader",
	[EG_OUTCOME_INVALID_ENCODING] = "InvalidEncoding",
};

/* The lastDeliveryOutcome name of an outcome; NULL for EG_OUTCOME_NONE. */
const char *
eg_outcome_name(EgOutcomeCode code)
{
	Assert(code >= 0 && code < EG_OUTCOME_COUNT);
	return outcome_names[code];
}

/*
 * The outcome named name (case-sensitive), as the history and the retries
 * store it; GenericError for a name eventgrid never writes, EG_OUTCOME_NONE
 * for NULL.
 */
EgOutcomeCode
eg_outcome_parse(const char *name)
{
	if (name == NULL)
		return EG_OUTCOME_NONE;
	for (int i = 1; i < EG_OUTCOME_COUNT; i++)
		if (strcmp(name, outcome_names[i]) == 0)
			return (EgOutcomeCode) i;
	return EG_OUTCOME_GENERIC_ERROR;
}

/* deadLetterReason of a final failure (SPEC 7); NULL for EG_REASON_NONE. */
const char *
eg_reason_name(EgFinalReason reason)
{
	switch (reason)
	{
		case EG_REASON_TTL:
			return "TimeToLiveExceeded";
		case EG_REASON_MAX_ATTEMPTS:
			return "MaxDeliveryAttemptsExceeded";
		case EG_REASON_NON_RETRIABLE:
			return "NonRetriableError";
		case EG_REASON_NONE:
			break;
	}
	return NULL;
}

bool
eg_status_is_success(int http_status)
{
	return http_status >= 200 && http_status <= 204;
}

/*
 * The outcome of one attempt (SPEC 3).  Statuses the Event Grid table does
 * not name are GenericError, with the number kept in last_http_status.
 */
EgOutcomeCode
eg_outcome_of(EgTransport transport, int http_status)
{
	switch (transport)
	{
		case EG_TRANSPORT_TIMEOUT:
			return EG_OUTCOME_TIMED_OUT;
		case EG_TRANSPORT_RESOLVE:
			return EG_OUTCOME_RESOLUTION_ERROR;
		case EG_TRANSPORT_SOCKET:
			return EG_OUTCOME_SOCKET_ERROR;
		case EG_TRANSPORT_HELD:
			return EG_OUTCOME_PROBATION;
		case EG_TRANSPORT_TOKEN:
			return EG_OUTCOME_GENERIC_ERROR;
		case EG_TRANSPORT_OK:
			break;
	}
	if (eg_status_is_success(http_status))
		return EG_OUTCOME_DELIVERED;
	switch (http_status)
	{
		case 400:
			return EG_OUTCOME_BAD_REQUEST;
		case 401:
			return EG_OUTCOME_UNAUTHORIZED;
		case 403:
			return EG_OUTCOME_FORBIDDEN;
		case 404:
			return EG_OUTCOME_NOT_FOUND;
		case 408:
			return EG_OUTCOME_TIMED_OUT;
		case 413:
			return EG_OUTCOME_PAYLOAD_TOO_LARGE;
		case 429:
		case 503:
			return EG_OUTCOME_BUSY;
		case 507:				/* Insufficient Storage; a destination that is full (SPEC 21) */
			return EG_OUTCOME_FULL;
		default:
			return EG_OUTCOME_GENERIC_ERROR;
	}
}

/*
 * Success only for 200-204.  Custom topics: no retry for 400, 401, 403, 413
 * (SPEC 3).  Namespace topics (SPEC 4): no retry for 400, 401, 403, 404,
 * 413, 414, and for the page's conditions that map to our outcomes: a
 * timeout (TimeoutException: no answer within the response timeout,
 * TimedOut), a socket error (SocketException: SocketError, and
 * ResolutionError, which .NET also reports as a SocketException).  A held
 * attempt (Probation) and one that got no bearer token (GenericError)
 * sent nothing, so they are retried in both profiles.
 */
EgVerdict
eg_verdict(EgProfile profile, EgTransport transport, int http_status)
{
	if (transport != EG_TRANSPORT_OK)
	{
		if (profile == EG_PROFILE_NAMESPACE && transport != EG_TRANSPORT_HELD && transport != EG_TRANSPORT_TOKEN)
			return EG_VERDICT_NO_RETRY;
		return EG_VERDICT_RETRY;
	}
	if (eg_status_is_success(http_status))
		return EG_VERDICT_DELIVERED;
	switch (http_status)
	{
		case 400:
		case 401:
		case 403:
		case 413:
			return EG_VERDICT_NO_RETRY;
		case 404:
		case 414:
			return profile == EG_PROFILE_NAMESPACE ? EG_VERDICT_NO_RETRY : EG_VERDICT_RETRY;
		default:
			return EG_VERDICT_RETRY;
	}
}

/*
 * Delay in milliseconds before the next attempt, after failed attempt number
 * failed_attempt (>= 1), without jitter, in the profile's schedule.  Floors:
 * 2 minutes after 408, 30 seconds after 503, otherwise 10 s.  http_status 0
 * means no HTTP answer.
 */
int64
eg_retry_delay_ms(EgProfile profile, int failed_attempt, int http_status)
{
	int64		delay_s;

	failed_attempt = Max(failed_attempt, 1);
	if (profile == EG_PROFILE_NAMESPACE)
	{
		int			n = lengthof(eg_namespace_offsets_s);

		if (failed_attempt < n)
			delay_s = eg_namespace_offsets_s[failed_attempt] - eg_namespace_offsets_s[failed_attempt - 1];
		else
			delay_s = 5 * 60;
	}
	else
		delay_s = eg_schedule_s[Min(failed_attempt, (int) lengthof(eg_schedule_s)) - 1];

	if (http_status == 408)
		delay_s = Max(delay_s, 2 * 60);
	else if (http_status == 503)
		delay_s = Max(delay_s, 30);
	else
		delay_s = Max(delay_s, 10);
	return delay_s * 1000;
}

/*
 * What happens to a delivery after one attempt (SPEC 3, 4 and 7), in the
 * subscription's delivery profile: the attempt count advances; a success is final; a no-retry status ends it
 * with reason NonRetriableError, and so does the last allowed attempt with
 * MaxDeliveryAttemptsExceeded; otherwise the next attempt waits the
 * scheduled delay plus random_fraction (0 to 1) of jitter_percent of it,
 * or retry_after_ms (the answer's Retry-After, already capped by
 * eventgrid.max_retry_after; 0: none) when that is later.
 */
EgDecision
eg_decide(EgProfile profile, int attempts_before, int max_attempts, EgTransport transport,
		  int http_status, int jitter_percent, double random_fraction, int64 retry_after_ms)
{
	EgVerdict	verdict = eg_verdict(profile, transport, http_status);
	EgDecision	dec;

	dec.attempts_after = attempts_before + 1;
	dec.outcome = eg_outcome_of(transport, http_status);
	dec.http_status = transport == EG_TRANSPORT_OK ? http_status : 0;
	dec.reason = EG_REASON_NONE;
	dec.delay_ms = 0;
	if (verdict == EG_VERDICT_DELIVERED)
		dec.action = EG_ACTION_DELIVERED;
	else if (verdict == EG_VERDICT_NO_RETRY)
	{
		dec.action = EG_ACTION_FINAL;
		dec.reason = EG_REASON_NON_RETRIABLE;
	}
	else if (dec.attempts_after >= max_attempts)
	{
		dec.action = EG_ACTION_FINAL;
		dec.reason = EG_REASON_MAX_ATTEMPTS;
	}
	else
	{
		dec.action = EG_ACTION_RETRY;
		dec.delay_ms = eg_retry_delay_ms(profile, dec.attempts_after, dec.http_status);
		dec.delay_ms += (int64) (dec.delay_ms * (jitter_percent / 100.0) * random_fraction);
		dec.delay_ms = Max(dec.delay_ms, retry_after_ms);
	}
	return dec;
}

/* See outcome.h. */
EgAction
eg_before_attempt(bool subscription_gone, bool expired, int attempts, int max_attempts,
				  EgFinalReason *reason)
{
	*reason = EG_REASON_NONE;
	if (subscription_gone)
		return EG_ACTION_GONE;
	if (expired)
		*reason = EG_REASON_TTL;
	else if (attempts >= max_attempts)
		*reason = EG_REASON_MAX_ATTEMPTS;
	return *reason == EG_REASON_NONE ? EG_ACTION_UNDECIDED : EG_ACTION_FINAL;
}

/*
 * Delayed delivery (SPEC 6): how long an endpoint stays on probation, in
 * milliseconds, when a failure with this lastDeliveryOutcome puts it there
 * for the probation-th time in a row (>= 1; the count starts again after a
 * success).  The first probation lasts the time of the contract's table
 * (Busy and TimedOut 10 s, SocketError 30 s, NotFound, ResolutionError,
 * Unauthorized, Forbidden, Disabled and Full 5 minutes; any other failure,
 * such as GenericError or Aborted, 10 s); each further one in a row lasts
 * twice the one before, up to EG_MAX_PROBATION_MS (4 hours).  Returns -1
 * for outcomes that say nothing about the endpoint's health: success,
 * BadRequest and PayloadTooLarge (a problem of the event, not of the
 * endpoint) and Probation itself.
 */
int64
eg_probation_ms(EgOutcomeCode outcome, int probation)
{
	int64		ms;

	switch (outcome)
	{
		case EG_OUTCOME_NONE:
		case EG_OUTCOME_DELIVERED:
		case EG_OUTCOME_BAD_REQUEST:
		case EG_OUTCOME_PAYLOAD_TOO_LARGE:
		case EG_OUTCOME_PROBATION:
			return -1;
		case EG_OUTCOME_SOCKET_ERROR:
			ms = 30 * 1000;
			break;
		case EG_OUTCOME_NOT_FOUND:
		case EG_OUTCOME_RESOLUTION_ERROR:
		case EG_OUTCOME_DISABLED:
		case EG_OUTCOME_FULL:
		case EG_OUTCOME_UNAUTHORIZED:
		case EG_OUTCOME_FORBIDDEN:
			ms = 300 * 1000;
			break;
		default:				/* Busy, TimedOut, and any other failure */
			ms = 10 * 1000;
			break;
	}
	for (int i = 1; i < probation && ms < EG_MAX_PROBATION_MS; i++)
		ms *= 2;
	return Min(ms, EG_MAX_PROBATION_MS);
}

PG_FUNCTION_INFO_V1(eventgrid_probation_duration);

/*
 * SQL: eventgrid.probation_duration(outcome text, probation integer) ->
 * interval: eg_probation_ms() as an interval; NULL for an outcome that does
 * not put an endpoint on probation.  outcome must be a lastDeliveryOutcome
 * name (22023), probation 1-1000 (22003).
 */
Datum
eventgrid_probation_duration(PG_FUNCTION_ARGS)
{
	char	   *outcome;
	int			probation;
	EgOutcomeCode code;
	int64		ms;
	Interval   *result;

	if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
		PG_RETURN_NULL();
	outcome = text_to_cstring(PG_GETARG_TEXT_PP(0));
	probation = PG_GETARG_INT32(1);
	code = eg_outcome_parse(outcome);
	if (strcmp(eg_outcome_name(code), outcome) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("outcome must be a lastDeliveryOutcome name, got \"%.64s\"", outcome),
				 errhint("Names are case-sensitive, e.g. Busy, NotFound, SocketError, ResolutionError, TimedOut, Unauthorized, Forbidden, GenericError.")));
	if (probation < 1 || probation > 1000)
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("probation must be between 1 and 1000, got %d", probation),
				 errhint("probation counts the probations in a row: 1 for the first.")));
	ms = eg_probation_ms(code, probation);
	if (ms < 0)
		PG_RETURN_NULL();
	result = (Interval *) palloc0(sizeof(Interval));
	result->time = ms * 1000;
	PG_RETURN_INTERVAL_P(result);
}

PG_FUNCTION_INFO_V1(eventgrid_retry_delay);

/*
 * SQL: eventgrid.retry_delay(attempt integer, http_status integer,
 * topic_type text) -> interval: eg_retry_delay_ms() of the profile (custom:
 * attempt 1-30, namespace: 1-10); NULL when the status is a success or not
 * retried.  Errors: 22003 attempt or status out of range, 22023 topic_type.
 */
Datum
eventgrid_retry_delay(PG_FUNCTION_ARGS)
{
	int			attempt;
	int			status = 0;
	EgProfile	profile = EG_PROFILE_CUSTOM;
	int			max_attempt;
	Interval   *result;
	int64		ms;

	if (PG_ARGISNULL(0) || PG_ARGISNULL(2))
		PG_RETURN_NULL();
	{
		char	   *type = text_to_cstring(PG_GETARG_TEXT_PP(2));

		if (strcmp(type, "namespace") == 0)
			profile = EG_PROFILE_NAMESPACE;
		else if (strcmp(type, "custom") != 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("topic_type must be custom or namespace, got \"%.64s\"", type)));
	}
	max_attempt = profile == EG_PROFILE_NAMESPACE ? EG_MAX_DELIVERY_COUNT : EG_MAX_DELIVERY_ATTEMPTS;
	attempt = PG_GETARG_INT32(0);
	if (attempt < 1 || attempt > max_attempt)
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("attempt must be between 1 and %d, got %d", max_attempt, attempt),
				 errhint("attempt is the number of the delivery attempt that failed.")));
	if (!PG_ARGISNULL(1))
	{
		status = PG_GETARG_INT32(1);
		if (status < 100 || status > 599)
			ereport(ERROR,
					(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
					 errmsg("http_status must be between 100 and 599, got %d", status),
					 errhint("Pass NULL for an attempt that got no HTTP answer.")));
		if (eg_verdict(profile, EG_TRANSPORT_OK, status) != EG_VERDICT_RETRY)
			PG_RETURN_NULL();
	}
	ms = eg_retry_delay_ms(profile, attempt, status);
	result = (Interval *) palloc0(sizeof(Interval));
	result->time = ms * 1000;
	PG_RETURN_INTERVAL_P(result);
}

PG_FUNCTION_INFO_V1(eventgrid_delivery_outcome);

/* SQL: eventgrid.delivery_outcome(http_status integer) -> text */
Datum
eventgrid_delivery_outcome(PG_FUNCTION_ARGS)
{
	int			status = PG_GETARG_INT32(0);

	if (status < 100 || status > 599)
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("http_status must be between 100 and 599, got %d", status)));
	PG_RETURN_TEXT_P(cstring_to_text(eg_outcome_name(eg_outcome_of(EG_TRANSPORT_OK, status))));
}
