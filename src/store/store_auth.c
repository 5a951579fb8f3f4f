/*
 * store_auth.c - the credentials a delivery worker loads once per change
 * of an event subscription (its claims name when they were set): client
 * certificates (SPEC 12, mutual TLS) and delivery authentication (bearer
 * tokens); and a destination's credentials (SPEC 21), read with each claim.
 */
#include "store/store.h"
#include "store/store_sql.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"

static EgStatement client_certificate = {
	.name = "client certificate",
	.sql = "SELECT c.certificate, c.private_key, c.set_at FROM eventgrid.client_certificates c"
	" WHERE c.subscription_id = $1",
	.nargs = 1,
	.types = {INT8OID},
};

/*
 * The client certificate (with any chain) and private key of event
 * subscription sub_id, PEM texts valid until the unit of work ends (the
 * caller copies them and clears these), and when they were set; false when
 * it has none.  In a unit of work.
 */
bool
eg_store_client_certificate(int64 sub_id, char **cert, char **key, TimestampTz *set_at)
{
	Datum		args[1] = {Int64GetDatum(sub_id)};

	eg_store_run(&client_certificate, args, SPI_OK_SELECT);	/* a snapshot no older than the claim's */
	if (SPI_processed == 0)
		return false;
	*cert = eg_text_col(SPI_tuptable, 0, 1);
	*key = eg_text_col(SPI_tuptable, 0, 2);
	*set_at = eg_timestamp_col(SPI_tuptable, 0, 3);
	return true;
}

static EgStatement delivery_authentication = {
	.name = "delivery authentication",
	.sql = "SELECT " EG_SQL_AUTH_COLS ", a.set_at"
	"  FROM eventgrid.delivery_authentications a WHERE a.subscription_id = $1",
	.nargs = 1,
	.types = {INT8OID},
};

/*
 * A delivery authentication's texts (valid until the unit of work ends):
 * the EG_SQL_AUTH_COLS columns of row row from column first on.
 */
void
eg_auth_row_cols(SPITupleTable *tt, int row, int first, EgAuthRow *a)
{
	a->method = eg_text_col(tt, row, first);
	a->token_endpoint = eg_text_col(tt, row, first + 1);
	a->tenant_id = eg_text_col(tt, row, first + 2);
	a->client_id = eg_text_col(tt, row, first + 3);
	a->client_secret = eg_text_col(tt, row, first + 4);
	a->scope = eg_text_col(tt, row, first + 5);
	a->audience = eg_text_col(tt, row, first + 6);
}

/*
 * The delivery authentication of event subscription sub_id (texts valid
 * until the unit of work ends: the caller copies them and clears the
 * secret); false when it has none.  In a unit of work.
 */
bool
eg_store_delivery_authentication(int64 sub_id, EgAuthRow *row)
{
	Datum		args[1] = {Int64GetDatum(sub_id)};

	eg_store_run(&delivery_authentication, args, SPI_OK_SELECT);	/* a snapshot no older than the claim's */
	if (SPI_processed == 0)
		return false;
	eg_auth_row_cols(SPI_tuptable, 0, 1, row);
	row->set_at = eg_timestamp_col(SPI_tuptable, 0, 8);
	return true;
}

static EgStatement destination_credentials = {
	.name = "destination credentials",
	.sql = "SELECT c.kind, c.user_name, c.secret FROM eventgrid.destination_credentials c"
	" WHERE c.subscription_id = $1",
	.nargs = 1,
	.types = {INT8OID},
};

/*
 * The credentials of event subscription sub_id's destination (SPEC 21):
 * their kind (password: a Redis server's, with its user name or NULL;
 * sas: a Storage queue's SAS token; shared_key: a Storage account's key)
 * and secret, texts valid until the unit of work ends (the caller clears
 * the secret); false when it has none.  In a unit of work.
 */
bool
eg_store_destination_credentials(int64 sub_id, char **kind, char **user, char **secret)
{
	Datum		args[1] = {Int64GetDatum(sub_id)};

	eg_store_run(&destination_credentials, args, SPI_OK_SELECT);	/* a snapshot no older than the claim's */
	if (SPI_processed == 0)
		return false;
	*kind = eg_text_col(SPI_tuptable, 0, 1);
	*user = eg_text_col(SPI_tuptable, 0, 2);
	*secret = eg_text_col(SPI_tuptable, 0, 3);
	return true;
}
