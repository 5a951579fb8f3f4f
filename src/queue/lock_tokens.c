/*
 * lock_tokens.c - the lock tokens the subscriber operations are given
 * (acknowledge, release, reject, renew_locks; SPEC 14): receive() makes
 * each as "<event id>:<lock secret>", the id a queue_events id and the
 * secret a UUID in its canonical text (gen_random_uuid()).  A token of
 * another form settles nothing and fails alone (InvalidLockToken, from
 * eventgrid._lock_token_results()).
 *
 * This is the check of every token of every call, so it is C: the SQL
 * it replaces (a regular expression, split_part and casts per token) cost
 * 16 us a token, more than the DELETE that settles it (bench/RESULTS.md,
 * figure 21 at 0.17.0).
 */
#include "core/eventgrid.h"

#include <ctype.h>

#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "fmgr.h"
#include "funcapi.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"

/* at most this many tokens a call: ten receive() calls' worth */
#define EG_LOCK_TOKENS_MAX 1000
/* the id: 1-18 digits (an int8 whatever they are) */
#define EG_LOCK_ID_MAX_DIGITS 18
/* the secret: a UUID as 8-4-4-4-12 hexadecimal digits */
#define EG_UUID_TEXT_LEN 36
#define EG_LOCK_TOKEN_MAX_LEN (EG_LOCK_ID_MAX_DIGITS + 1 + EG_UUID_TEXT_LEN)

/*
 * Whether s (len bytes) is <1-18 digits>:<uuid>; if so *id is the number
 * and normalized (EG_LOCK_TOKEN_MAX_LEN + 1 bytes) the token as receive()
 * writes it (the id without leading zeros, the secret in lower case), which
 * the operations compare with.
 */
static bool
parse_token(const char *s, int len, int64 *id, char *normalized)
{
	int			digits = 0;
	const char *secret;
	char	   *out;

	while (digits < len && isdigit((unsigned char) s[digits]))
		digits++;
	if (digits < 1 || digits > EG_LOCK_ID_MAX_DIGITS || len != digits + 1 + EG_UUID_TEXT_LEN || s[digits] != ':')
		return false;
	secret = s + digits + 1;
	for (int i = 0; i < EG_UUID_TEXT_LEN; i++)
	{
		bool		dash = i == 8 || i == 13 || i == 18 || i == 23;

		if (dash ? secret[i] != '-' : !isxdigit((unsigned char) secret[i]))
			return false;
	}
	*id = 0;
	for (int i = 0; i < digits; i++)
		*id = *id * 10 + (s[i] - '0');	/* at most 18 digits: no overflow */
	out = normalized + snprintf(normalized, EG_LOCK_ID_MAX_DIGITS + 2, INT64_FORMAT ":", *id);
	for (int i = 0; i < EG_UUID_TEXT_LEN; i++)
		out[i] = pg_ascii_tolower((unsigned char) secret[i]);
	out[EG_UUID_TEXT_LEN] = '\0';
	return true;
}

PG_FUNCTION_INFO_V1(eventgrid_lock_token_keys);

/*
 * eventgrid._lock_token_keys(lock_tokens text[], OUT ids bigint[], OUT
 * tokens text[]): the well-formed tokens of an operation's argument, in
 * the order given, as the event ids they name and the tokens normalized
 * (id:secret in lower case), which the operations find their rows by
 * (primary key, then the token).  Malformed tokens and NULL elements are
 * left out (they fail alone).  Errors: 22004 lock_tokens NULL, 54000 more
 * than 1000 tokens.
 */
Datum
eventgrid_lock_token_keys(PG_FUNCTION_ARGS)
{
	ArrayType  *arr;
	Datum	   *elems;
	bool	   *elem_nulls;
	int			n;
	Datum	   *ids;
	Datum	   *tokens;
	int			kept = 0;
	TupleDesc	tupdesc;
	Datum		result[2];
	bool		result_nulls[2] = {false, false};
	int16		int8_len;
	bool		int8_byval;
	char		int8_align;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("lock_tokens must not be NULL")));
	arr = PG_GETARG_ARRAYTYPE_P(0);
	n = ArrayGetNItems(ARR_NDIM(arr), ARR_DIMS(arr));
	if (n > EG_LOCK_TOKENS_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("lock_tokens must hold at most %d lock tokens, got %d", EG_LOCK_TOKENS_MAX, n),
				 errhint("Settle the events of up to ten receive() calls at a time.")));
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "_lock_token_keys must return a record");
	deconstruct_array(arr, TEXTOID, -1, false, TYPALIGN_INT, &elems, &elem_nulls, &n);
	ids = palloc(sizeof(Datum) * Max(n, 1));
	tokens = palloc(sizeof(Datum) * Max(n, 1));
	for (int i = 0; i < n; i++)
	{
		text	   *t;
		int64		id;
		char		normalized[EG_LOCK_TOKEN_MAX_LEN + 1];

		if (elem_nulls[i])
			continue;
		t = DatumGetTextPP(elems[i]);
		if (!parse_token(VARDATA_ANY(t), VARSIZE_ANY_EXHDR(t), &id, normalized))
			continue;
		ids[kept] = Int64GetDatum(id);
		tokens[kept] = CStringGetTextDatum(normalized);
		kept++;
	}
	get_typlenbyvalalign(INT8OID, &int8_len, &int8_byval, &int8_align);
	result[0] = PointerGetDatum(construct_array(ids, kept, INT8OID, int8_len, int8_byval, int8_align));
	result[1] = PointerGetDatum(construct_array(tokens, kept, TEXTOID, -1, false, TYPALIGN_INT));
	tupdesc = BlessTupleDesc(tupdesc);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, result, result_nulls)));
}
