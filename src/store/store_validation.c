/*
 * store_validation.c - endpoint validations at the SQL boundary: those due
 * (eventgrid.endpoint_validations in provisioning state Creating, whose
 * next try has come), with the request the upkeep worker sends, and the
 * answers recorded by eventgrid._record_validation().
 */
#include "store/store.h"
#include "store/store_sql.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

/* manual validations not done within 10 minutes fail ($1: now) */
static EgStatement expire_manual = {
	.name = "manual validation expiry",
	.sql =
	"SELECT eventgrid._fail_validation(v.subscription_id, 'not validated manually within 10 minutes')"
	"  FROM eventgrid.endpoint_validations v"
	" WHERE v.state = 'AwaitingManualAction' AND v.manual_since + interval '10 minutes' <= $1",
	.nargs = 1,
	.types = {TIMESTAMPTZOID},
};

/*
 * The due validations ($1: now, at most $2): the subscription, the code,
 * the endpoint, which handshake, the SubscriptionValidationEvent (made
 * here as JSON, with Event Grid's fields; no validationUrl: there is no
 * HTTP server in the database, validate_event_subscription() takes its
 * place), the static custom headers, the rate, the client certificate
 * with its key (PEM, or NULL) and the delivery authentication (or NULL).
 */
static EgStatement due = {
	.name = "due validations",
	.sql =
	"SELECT v.subscription_id, s.topic, s.name, v.code, s.endpoint,"
	"       s.event_delivery_schema = 'CloudEventSchemaV1_0',"
	"       jsonb_build_array(jsonb_build_object('id', gen_random_uuid()::text, 'topic', s.topic, 'subject', '',"
	"           'data', jsonb_build_object('validationCode', v.code),"
	"           'eventType', 'Microsoft.EventGrid.SubscriptionValidationEvent',"
	"           'eventTime', eventgrid.rfc3339($1), 'metadataVersion', '1', 'dataVersion', '2'))::text,"
	"       (SELECT string_agg(p.header || ': ' || p.value, E'\\n' ORDER BY p.header)"
	"          FROM eventgrid.delivery_properties p"
	"         WHERE p.subscription_id = s.id AND p.source_field IS NULL),"
	"       s.max_events_per_second, c.certificate, c.private_key, " EG_SQL_AUTH_COLS
	"  FROM eventgrid.endpoint_validations v JOIN eventgrid.event_subscriptions s ON s.id = v.subscription_id"
	"  LEFT JOIN eventgrid.client_certificates c ON c.subscription_id = s.id"
	"  LEFT JOIN eventgrid.delivery_authentications a ON a.subscription_id = s.id"
	" WHERE v.state = 'Creating' AND v.next_try_at <= $1"
	" ORDER BY v.next_try_at LIMIT $2",
	.nargs = 2,
	.types = {TIMESTAMPTZOID, INT4OID},
};

static EgStatement pending_count = {
	.name = "unfinished validations",
	.sql =
	"SELECT count(*) FROM eventgrid.endpoint_validations w WHERE w.state IN ('Creating', 'AwaitingManualAction')",
};

int
eg_store_due_validations(TimestampTz now, int limit, MemoryContext cxt, EgValidation **rows, int64 *pending)
{
	Datum		args[2];
	SPITupleTable *tt;
	int			n;
	MemoryContext old;
	EgValidation *out;

	args[0] = TimestampTzGetDatum(now);
	eg_store_run(&expire_manual, args, SPI_OK_SELECT);
	args[1] = Int32GetDatum(limit);
	/* new snapshots: they follow expire_manual's writes in this unit of work */
	eg_store_run(&due, args, SPI_OK_SELECT);
	n = (int) SPI_processed;
	tt = SPI_tuptable;
	*rows = NULL;
	if (n == 0)
	{
		eg_store_run(&pending_count, NULL, SPI_OK_SELECT);
		*pending = eg_int64_col(SPI_tuptable, 0, 1, 0);
		return 0;
	}
	*pending = n;				/* at least these; the caller looks again soon */
	old = MemoryContextSwitchTo(cxt);
	out = palloc0(n * sizeof(EgValidation));
	for (int i = 0; i < n; i++)
	{
		out[i].subscription_id = eg_int64_col(tt, i, 1, 0);
		out[i].topic = eg_text_col(tt, i, 2);
		out[i].name = eg_text_col(tt, i, 3);
		out[i].code = eg_text_col(tt, i, 4);
		out[i].endpoint = eg_text_col(tt, i, 5);
		out[i].cloudevents = eg_bool_col(tt, i, 6);
		out[i].body = eg_text_col(tt, i, 7);
		out[i].headers = eg_text_col(tt, i, 8);
		out[i].rate = eg_int32_col(tt, i, 9, 0);
		out[i].client_cert = eg_text_col(tt, i, 10);
		out[i].client_key = eg_text_col(tt, i, 11);
		if (eg_text_col(tt, i, 12) != NULL)
		{
			out[i].auth = palloc0(sizeof(EgAuthRow));
			eg_auth_row_cols(tt, i, 12, out[i].auth);
		}
	}
	MemoryContextSwitchTo(old);
	*rows = out;
	return n;
}

static EgStatement record = {
	.name = "validation record",
	.sql = "SELECT eventgrid._record_validation($1, $2, $3, $4, $5, $6, $7, $8)",
	.nargs = 8,
	.types = {INT8OID, TEXTOID, INT4OID, TEXTOID, TEXTOID, TEXTOID, TEXTOID, TEXTOID},
};

char *
eg_store_record_validation(const EgValidation *v, const char *origin)
{
	Datum		args[8];
	char		nulls[9] = "        ";

	args[0] = Int64GetDatum(v->subscription_id);
	args[1] = CStringGetTextDatum(v->code);
	args[2] = Int32GetDatum(v->http_status);
	args[3] = CStringGetTextDatum(v->answer_body ? v->answer_body : "");
	if (v->allowed_origin)
		args[4] = CStringGetTextDatum(v->allowed_origin);
	else
		nulls[4] = 'n';
	if (v->allowed_rate)
		args[5] = CStringGetTextDatum(v->allowed_rate);
	else
		nulls[5] = 'n';
	args[6] = CStringGetTextDatum(origin);
	if (v->error)
		args[7] = CStringGetTextDatum(v->error);
	else
		nulls[7] = 'n';
	eg_store_run_nulls(&record, args, nulls, SPI_OK_SELECT);
	return eg_text_col(SPI_tuptable, 0, 1);
}
