/*
 * store_claim_cols.c - reading what both claims return for a request
 * (store_claim.h: REQUEST_COLS, enum RequestCol) from a result row.
 */
#include "store/store_claim.h"

#include "utils/builtins.h"
#include "utils/jsonb.h"

/* A text column borrowed from the result (valid until eg_store_commit()). */
static void
payload_col(SPITupleTable *tt, int row, int col, EgEventPart *part)
{
	bool		isnull;
	Datum		v = SPI_getbinval(tt->vals[row], tt->tupdesc, col, &isnull);

	if (!isnull)
	{
		text	   *t = DatumGetTextPP(v);

		part->json = VARDATA_ANY(t);
		part->len = VARSIZE_ANY_EXHDR(t);
	}
}

/*
 * Text column col of row, palloc'd, or same itself when it holds the same
 * text (NULL: no text to share).
 */
static char *
shared_text_col(SPITupleTable *tt, int row, int col, const char *same)
{
	bool		isnull;
	Datum		d = SPI_getbinval(tt->vals[row], tt->tupdesc, col, &isnull);
	text	   *t;

	if (isnull)
		return NULL;
	t = DatumGetTextPP(d);
	if (same != NULL && strlen(same) == VARSIZE_ANY_EXHDR(t) &&
		memcmp(same, VARDATA_ANY(t), VARSIZE_ANY_EXHDR(t)) == 0)
		return (char *) same;
	return text_to_cstring(t);
}

/* See store_claim.h. */
void
eg_claim_request_cols(SPITupleTable *tt, int row, int first, EgClaimedRow *r, const EgClaimedRow *prev)
{
#define SHARED(field, col) shared_text_col(tt, row, first + (col), prev ? prev->field : NULL)
	r->max_attempts = eg_int32_col(tt, row, first + RC_MAX_ATTEMPTS, 1);
	r->endpoint = SHARED(endpoint, RC_ENDPOINT);
	r->subscription_name = SHARED(subscription_name, RC_NAME);
	r->schema = SHARED(schema, RC_SCHEMA);
	r->max_events_per_batch = eg_int32_col(tt, row, first + RC_MAX_EVENTS, 0);
	r->preferred_batch_kb = eg_int32_col(tt, row, first + RC_PREFERRED_KB, 0);
	payload_col(tt, row, first + RC_PAYLOAD, &r->payload);
	r->output_event_id = eg_text_col(tt, row, first + RC_OUTPUT_EVENT_ID);
	r->data_version = SHARED(data_version, RC_DATA_VERSION);
	r->metadata_version = SHARED(metadata_version, RC_METADATA_VERSION);
	r->custom_headers = SHARED(custom_headers, RC_CUSTOM_HEADERS);
	r->signing_keys = SHARED(signing_keys, RC_SIGNING_KEYS);
	r->source = SHARED(source, RC_SOURCE);
	r->client_cert_set_at = eg_timestamp_col(tt, row, first + RC_CLIENT_CERT_SET_AT);
	r->auth_set_at = eg_timestamp_col(tt, row, first + RC_AUTH_SET_AT);
	r->endpoint_type = SHARED(endpoint_type, RC_ENDPOINT_TYPE);
	r->ordering_key = eg_text_col(tt, row, first + RC_ORDERING_KEY);
#undef SHARED
}
