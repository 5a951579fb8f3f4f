/*
 * retry.c - outcome classification, the retry schedules of Event Grid's
 * two delivery profiles and the decision after each attempt (SPEC sections
 * 3, 4 and 7).  Pure functions with no
 * I/O: the worker calls eg_decide() after each delivery attempt, and
 * eventgrid.retry_delay() / eventgrid.delivery_outcome() expose them to SQL
 * for users and tests.
 */
#include "eventgrid.h"

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

bool
eg_status_is_success(int http_status)
{
	return http_status >= 200 && http_status <= 204;
}

/*
 * lastDeliveryOutcome name for one attempt (SPEC 3).  Statuses the Event Grid
 * table does not name are recorded as GenericError, with the number kept in
 * last_http_status.
 */
const char *
eg_outcome_name(EgTransport transport, int http_status)
{
	switch (transport)
	{
		case EG_TRANSPORT_TIMEOUT:
			return "TimedOut";
		case EG_TRANSPORT_RESOLVE:
			return "ResolutionError";
		case EG_TRANSPORT_SOCKET:
			return "SocketError";
		case EG_TRANSPORT_HELD:
			return "Probation";
		case EG_TRANSPORT_OK:
			break;
	}
	if (eg_status_is_success(http_status))
		return "Delivered";
	switch (http_status)
	{
		case 400:
			return "BadRequest";
		case 401:
			return "Unauthorized";
		case 403:
			return "Forbidden";
		case 404:
			return "NotFound";
		case 408:
			return "TimedOut";
		case 413:
			return "PayloadTooLarge";
		case 429:
		case 503:
			return "Busy";
		default:
			return "GenericError";
	}
}

/*
 * Success only for 200-204.  Custom topics: no retry for 400, 401, 403, 413
 * (SPEC 3).  Namespace topics (SPEC 4): no retry for 400, 401, 403, 404,
 * 413, 414, and for the page's conditions that map to our outcomes: a
 * timeout (TimeoutException: no answer within the response timeout,
 * TimedOut), a socket error (SocketException: SocketError, and
 * ResolutionError, which .NET also reports as a SocketException).  A held
 * attempt (Probation) sent nothing, so it is retried in both profiles.
 */
EgVerdict
eg_verdict(EgProfile profile, EgTransport transport, int http_status)
{
	if (transport != EG_TRANSPORT_OK)
	{
		if (profile == EG_PROFILE_NAMESPACE && transport != EG_TRANSPORT_HELD)
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
 * scheduled delay plus random_fraction (0 to 1) of jitter_percent of it.
 */
EgDecision
eg_decide(EgProfile profile, int attempts_before, int max_attempts, EgTransport transport,
		  int http_status, int jitter_percent, double random_fraction)
{
	EgVerdict	verdict = eg_verdict(profile, transport, http_status);
	EgDecision	dec;

	dec.attempts_after = attempts_before + 1;
	dec.outcome = eg_outcome_name(transport, http_status);
	dec.http_status = transport == EG_TRANSPORT_OK ? http_status : 0;
	dec.reason = NULL;
	dec.delay_ms = 0;
	if (verdict == EG_VERDICT_DELIVERED)
		dec.action = 'd';
	else if (verdict == EG_VERDICT_NO_RETRY)
	{
		dec.action = 'f';
		dec.reason = "NonRetriableError";
	}
	else if (dec.attempts_after >= max_attempts)
	{
		dec.action = 'f';
		dec.reason = "MaxDeliveryAttemptsExceeded";
	}
	else
	{
		dec.action = 'r';
		dec.delay_ms = eg_retry_delay_ms(profile, dec.attempts_after, dec.http_status);
		dec.delay_ms += (int64) (dec.delay_ms * (jitter_percent / 100.0) * random_fraction);
	}
	return dec;
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
eg_probation_ms(const char *outcome, int probation)
{
	static const struct
	{
		const char *outcome;
		int			seconds;
	}			table[] = {
		{"Busy", 10}, {"NotFound", 300}, {"SocketError", 30}, {"ResolutionError", 300},
		{"Disabled", 300}, {"Full", 300}, {"TimedOut", 10}, {"Unauthorized", 300},
		{"Forbidden", 300},
	};
	int64		ms = 10 * 1000;

	if (strcmp(outcome, "Delivered") == 0 || strcmp(outcome, "BadRequest") == 0 ||
		strcmp(outcome, "PayloadTooLarge") == 0 || strcmp(outcome, "Probation") == 0)
		return -1;
	for (int i = 0; i < (int) lengthof(table); i++)
		if (strcmp(outcome, table[i].outcome) == 0)
			ms = (int64) table[i].seconds * 1000;
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
	static const char *const names[] = {
		"Delivered", "NotFound", "Disabled", "Full", "Unauthorized", "BadRequest", "TimedOut", "Busy",
		"PayloadTooLarge", "Probation", "Canceled", "Aborted", "SocketError", "ResolutionError",
		"Forbidden", "GenericError", "InvalidHeader",
	};
	char	   *outcome;
	int			probation;
	bool		known = false;
	int64		ms;
	Interval   *result;

	if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
		PG_RETURN_NULL();
	outcome = text_to_cstring(PG_GETARG_TEXT_PP(0));
	probation = PG_GETARG_INT32(1);
	for (int i = 0; i < (int) lengthof(names) && !known; i++)
		known = strcmp(outcome, names[i]) == 0;
	if (!known)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("outcome must be a lastDeliveryOutcome name, got \"%.64s\"", outcome),
				 errhint("Names are case-sensitive, e.g. Busy, NotFound, SocketError, ResolutionError, TimedOut, Unauthorized, Forbidden, GenericError.")));
	if (probation < 1 || probation > 1000)
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("probation must be between 1 and 1000, got %d", probation),
				 errhint("probation counts the probations in a row: 1 for the first.")));
	ms = eg_probation_ms(outcome, probation);
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
	PG_RETURN_TEXT_P(cstring_to_text(eg_outcome_name(EG_TRANSPORT_OK, status)));
}
