/*
 * token.c - bearer tokens from an OAuth 2.0 token endpoint (SPEC section
 * 12; RFC 6749 section 4.4, the client-credentials grant; Microsoft Entra
 * ID's v2.0 token endpoint is one).
 *
 * The request: a POST of grant_type=client_credentials (and scope,
 * audience) as application/x-www-form-urlencoded, the client authenticated
 * with HTTP Basic (RFC 6749 section 2.3.1, which every server must accept)
 * or, for Entra ID, with client_id and client_secret in the body, as
 * Microsoft's page shows.  The delivery workers send it through their HTTP
 * thread like any request (it never holds a delivery up); the upkeep
 * worker's handshakes wait for it (eg_token_get_now).  The answer is read
 * with PostgreSQL's jsonb: access_token (printable b64token characters, RFC
 * 6750 section 2.1, at most EG_TOKEN_MAX_BYTES), token_type Bearer when
 * given, expires_in (EG_TOKEN_DEFAULT_LIFETIME_S when absent).  A token
 * serves until expires_in less min(10 %, 60 s) has passed.
 *
 * The tokens of a database are kept in shared memory, a slot per set of
 * credentials (database, token endpoint, client id, scope, audience; not
 * the secret), under one LWLock: the first process to find no token marks
 * the slot as asking for one and asks; the others wait for its answer
 * instead of asking too (one request per lifetime, not one per worker).  A
 * process that dies while asking is forgotten after the response timeout.
 * So that no request waits once the first token came, the next token is
 * asked for a little before a token stops serving (from renew_at: the last
 * tenth of its time, at most 30 s), while it still serves.  A failed
 * request is kept for EG_TOKEN_FAILURE_HOLD_MS: attempts in that time fail
 * with its error rather than ask again (or, while a token serves, go with
 * it).  With all EG_TOKEN_SLOTS
 * taken, a new set of credentials takes over a slot of its own database or
 * of one that holds more (find_slot): one database's hanging token
 * endpoints cannot starve another's.  No secret is in shared
 * memory, and no access token leaves it but to the process using it.
 */
#include "http/token.h"

#include "common/base64.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include <curl/curl.h>

typedef struct EgTokenSlot
{
	Oid			dboid;			/* InvalidOid: free */
	char		token_endpoint[EG_TOKEN_ENDPOINT_MAX + 1];
	char		client_id[EG_TOKEN_FIELD_MAX + 1];
	char		scope[EG_TOKEN_FIELD_MAX + 1];
	char		audience[EG_TOKEN_FIELD_MAX + 1];
	uint64		generation;
	pid_t		fetching_pid;	/* asking for a token now (0: nobody) */
	TimestampTz fetch_started;
	TimestampTz obtained_at;
	TimestampTz expires_at;
	TimestampTz refresh_at;
	TimestampTz renew_at;		/* the next token is asked for from then on, while this one serves */
	TimestampTz last_used;
	TimestampTz failed_at;		/* the last failed request's end (0: none since the last token) */
	int64		requests;
	int64		failures;
	char		error[EG_TOKEN_ERROR_MAX];
	int			len;			/* 0: no token */
	char		token[EG_TOKEN_MAX_BYTES + 1];
} EgTokenSlot;

typedef struct EgTokenShared
{
	LWLock	   *lock;
	uint64		next_generation;
	EgTokenSlot slot[EG_TOKEN_SLOTS];
} EgTokenShared;

static EgTokenShared *tokens = NULL;

Size
eg_token_shmem_size(void)
{
	return sizeof(EgTokenShared);
}

/* In the shmem request hook: the slots' LWLock. */
void
eg_token_shmem_request(void)
{
	RequestNamedLWLockTranche("eventgrid tokens", 1);
}

/* In the shmem startup hook, under AddinShmemInitLock. */
void
eg_token_shmem_init(void)
{
	bool		found;

	tokens = ShmemInitStruct("eventgrid tokens", eg_token_shmem_size(), &found);
	if (!found)
	{
		memset(tokens, 0, eg_token_shmem_size());
		tokens->lock = &(GetNamedLWLockTranche("eventgrid tokens"))->lock;
		tokens->next_generation = 1;
	}
}

/*
 * The token endpoint of Microsoft Entra tenant tenant_id under
 * eventgrid.entra_authority (palloc'd): {authority}/{tenant}/oauth2/v2.0/token.
 */
char *
eg_entra_token_endpoint(const char *tenant_id)
{
	const char *authority = eg_entra_authority != NULL ? eg_entra_authority : "";
	int			len = (int) strlen(authority);

	while (len > 0 && authority[len - 1] == '/')
		len--;
	return psprintf("%.*s/%s/oauth2/v2.0/token", len, authority, tenant_id);
}

static bool
same_text(const char *slot_text, const char *s)
{
	return strcmp(slot_text, s != NULL ? s : "") == 0;
}

/* Do a and b name the same client of the same token endpoint for the same scope and audience? */
bool
eg_token_same_client(const EgCredentials *a, const EgCredentials *b)
{
#define SAME(f) (strcmp(a->f != NULL ? a->f : "", b->f != NULL ? b->f : "") == 0)
	return SAME(token_endpoint) && SAME(client_id) && SAME(scope) && SAME(audience);
#undef SAME
}

static bool
fits(const EgCredentials *c)
{
	return strlen(c->token_endpoint) <= EG_TOKEN_ENDPOINT_MAX &&
		strlen(c->client_id) <= EG_TOKEN_FIELD_MAX &&
		(c->scope == NULL || strlen(c->scope) <= EG_TOKEN_FIELD_MAX) &&
		(c->audience == NULL || strlen(c->audience) <= EG_TOKEN_FIELD_MAX);
}

/* Is a process asking for the next token of slot s (and not for too long to be alive)? */
static bool
asking(const EgTokenSlot *s, TimestampTz now)
{
	return s->fetching_pid != 0 &&
		now - s->fetch_started < (TimestampTz) (eg_response_timeout_ms + 5000) * 1000;
}

/* How many slots database dboid holds (under the lock). */
static int
slots_of(Oid dboid)
{
	int			n = 0;

	for (int i = 0; i < EG_TOKEN_SLOTS; i++)
		n += tokens->slot[i].dboid == dboid;
	return n;
}

/*
 * The slot of c in this database, under the lock (held exclusively); a new
 * one when create.  A new one takes a free slot, else one of this
 * database's own or of a database that holds more slots than this one
 * (never one of a database that holds as many or fewer): an idle one first,
 * the least recently used, else the one whose request started first.  So
 * one database's token endpoints that never answer (a request in flight
 * for each of its slots) cost another database nothing, and one set of
 * credentials waits for no other's request: the request of a slot taken
 * over goes on, and its answer is stored in a slot of its own again.
 * NULL when !create and there is none.
 */
static EgTokenSlot *
find_slot(const EgCredentials *c, bool create)
{
	TimestampTz now = GetCurrentTimestamp();
	EgTokenSlot *victim = NULL;
	bool		victim_idle = false;
	int			mine = 0;

	for (int i = 0; i < EG_TOKEN_SLOTS; i++)
	{
		EgTokenSlot *s = &tokens->slot[i];

		if (s->dboid == MyDatabaseId && same_text(s->token_endpoint, c->token_endpoint) &&
			same_text(s->client_id, c->client_id) && same_text(s->scope, c->scope) &&
			same_text(s->audience, c->audience))
			return s;
		mine += s->dboid == MyDatabaseId;
	}
	if (!create)
		return NULL;
	for (int i = 0; i < EG_TOKEN_SLOTS && (victim == NULL || victim->dboid != InvalidOid); i++)
	{
		EgTokenSlot *s = &tokens->slot[i];
		bool		idle;

		if (s->dboid == InvalidOid)
		{
			victim = s;
			continue;
		}
		if (s->dboid != MyDatabaseId && slots_of(s->dboid) <= mine)
			continue;
		idle = !asking(s, now);
		if (victim == NULL || (idle && !victim_idle) ||
			(idle == victim_idle && (idle ? s->last_used < victim->last_used
									 : s->fetch_started < victim->fetch_started)))
		{
			victim = s;
			victim_idle = idle;
		}
	}
	if (victim == NULL)
		return NULL;
	memset(victim, 0, sizeof(EgTokenSlot));
	victim->dboid = MyDatabaseId;
	strlcpy(victim->token_endpoint, c->token_endpoint, sizeof(victim->token_endpoint));
	strlcpy(victim->client_id, c->client_id, sizeof(victim->client_id));
	strlcpy(victim->scope, c->scope ? c->scope : "", sizeof(victim->scope));
	strlcpy(victim->audience, c->audience ? c->audience : "", sizeof(victim->audience));
	victim->generation = tokens->next_generation++;
	return victim;
}

/* Did the last token request of slot s fail moments ago? */
static bool
failed_lately(const EgTokenSlot *s, TimestampTz now)
{
	return s->failed_at != 0 && now - s->failed_at < (TimestampTz) EG_TOKEN_FAILURE_HOLD_MS * 1000;
}

/*
 * What the shared slot of credentials c says now: a token that serves
 * (READY, copied into out; READY_RENEW when may_renew, it is near its end
 * and nobody asks for the next: the caller is marked as asking and must
 * ask), a failure moments ago (FAILED, its error in out->error), another
 * process asking (FETCHING), or nobody asking: then the caller is marked
 * as asking and must ask (FETCH).  Who asks reports the answer with
 * eg_token_store() or eg_token_failed().
 */
EgTokenState
eg_token_lookup(const EgCredentials *c, EgToken *out, bool may_renew)
{
	TimestampTz now = GetCurrentTimestamp();
	EgTokenSlot *s;
	EgTokenState state;

	out->len = 0;
	out->error[0] = '\0';
	if (!fits(c))
	{
		snprintf(out->error, sizeof(out->error),
				 "the token endpoint URL is longer than %d bytes (eventgrid.entra_authority too long?)",
				 EG_TOKEN_ENDPOINT_MAX);
		return EG_TOKEN_FAILED;
	}
	LWLockAcquire(tokens->lock, LW_EXCLUSIVE);
	s = find_slot(c, true);
	if (s == NULL)
	{
		/* every slot is asking for a token at this very moment */
		LWLockRelease(tokens->lock);
		return EG_TOKEN_FETCHING;
	}
	s->last_used = now;
	out->generation = s->generation;
	if (s->len > 0 && now < s->refresh_at)
	{
		memcpy(out->text, s->token, s->len);
		out->text[s->len] = '\0';
		out->len = s->len;
		out->refresh_at = s->refresh_at;
		out->renew_at = s->renew_at;
		state = EG_TOKEN_READY;
		if (may_renew && now >= s->renew_at && !asking(s, now) && !failed_lately(s, now))
		{
			s->fetching_pid = MyProcPid;
			s->fetch_started = now;
			s->requests++;
			state = EG_TOKEN_READY_RENEW;
		}
	}
	else if (asking(s, now))
		state = EG_TOKEN_FETCHING;
	else if (failed_lately(s, now))
	{
		strlcpy(out->error, s->error, sizeof(out->error));
		state = EG_TOKEN_FAILED;
	}
	else
	{
		s->fetching_pid = MyProcPid;
		s->fetch_started = now;
		s->requests++;
		state = EG_TOKEN_FETCH;
	}
	LWLockRelease(tokens->lock);
	return state;
}

/*
 * The token endpoint gave a token for c, good for expires_in_s seconds: it
 * is shared, and copied to *out as eg_token_lookup() would (out->len 0:
 * unusable, too long).  The caller uses the copy: with more sets of
 * credentials than EG_TOKEN_SLOTS in use, the slot may be taken over by
 * others before this process looks again.
 */
void
eg_token_store(const EgCredentials *c, const char *token, int len, int64 expires_in_s, EgToken *out)
{
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz lifetime = expires_in_s * USECS_PER_SEC;
	TimestampTz margin = Min(lifetime / 10, 60 * USECS_PER_SEC);
	EgTokenSlot *s;

	out->len = 0;
	out->error[0] = '\0';
	if (!fits(c) || len <= 0 || len > EG_TOKEN_MAX_BYTES)
		return;
	memcpy(out->text, token, len);
	out->text[len] = '\0';
	out->len = len;
	out->refresh_at = now + lifetime - margin;
	out->renew_at = out->refresh_at - Min((lifetime - margin) / 10, 30 * USECS_PER_SEC);
	LWLockAcquire(tokens->lock, LW_EXCLUSIVE);
	out->generation = tokens->next_generation++;
	s = find_slot(c, true);
	if (s != NULL)
	{
		memcpy(s->token, token, len);
		s->token[len] = '\0';
		s->len = len;
		s->generation = out->generation;
		s->obtained_at = now;
		s->expires_at = now + lifetime;
		s->refresh_at = out->refresh_at;
		s->renew_at = out->renew_at;
		s->last_used = now;
		s->failed_at = 0;
		s->error[0] = '\0';
		if (s->fetching_pid == MyProcPid)
			s->fetching_pid = 0;
	}
	LWLockRelease(tokens->lock);
}

/* A token request for c failed with error (printable, no secret). */
void
eg_token_failed(const EgCredentials *c, const char *error)
{
	EgTokenSlot *s;

	if (!fits(c))
		return;
	LWLockAcquire(tokens->lock, LW_EXCLUSIVE);
	s = find_slot(c, true);
	if (s != NULL)
	{
		s->failures++;
		s->failed_at = GetCurrentTimestamp();
		strlcpy(s->error, error, sizeof(s->error));
		if (s->fetching_pid == MyProcPid)
			s->fetching_pid = 0;
	}
	LWLockRelease(tokens->lock);
}

/*
 * A receiver refused the token of generation generation (HTTP 401): it is
 * dropped, unless another process replaced it meanwhile.
 */
void
eg_token_drop(const EgCredentials *c, uint64 generation)
{
	EgTokenSlot *s;

	if (!fits(c))
		return;
	LWLockAcquire(tokens->lock, LW_EXCLUSIVE);
	s = find_slot(c, false);
	if (s != NULL && s->generation == generation && s->len > 0)
	{
		explicit_bzero(s->token, s->len);
		s->len = 0;
		s->refresh_at = 0;
		s->generation = tokens->next_generation++;
	}
	LWLockRelease(tokens->lock);
}

/* This process asks for no token any more (it exits): others may ask at once. */
void
eg_token_release_fetches(void)
{
	if (tokens == NULL)
		return;
	LWLockAcquire(tokens->lock, LW_EXCLUSIVE);
	for (int i = 0; i < EG_TOKEN_SLOTS; i++)
		if (tokens->slot[i].fetching_pid == MyProcPid)
			tokens->slot[i].fetching_pid = 0;
	LWLockRelease(tokens->lock);
}

PG_FUNCTION_INFO_V1(eventgrid_delivery_tokens);

/*
 * SQL: eventgrid._delivery_tokens() -> SETOF (token_endpoint, client_id,
 * scope, audience, token_obtained_at, token_expires_at, token_serves_until,
 * token_requests, token_failures, last_failure_at, last_error): the tokens this database's
 * workers keep in shared memory, never the token itself.  Empty when the
 * library is not preloaded.
 */
Datum
eventgrid_delivery_tokens(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;

	eg_materialized_srf(fcinfo);
	if (tokens == NULL)
		return (Datum) 0;
	LWLockAcquire(tokens->lock, LW_SHARED);
	for (int i = 0; i < EG_TOKEN_SLOTS; i++)
	{
		EgTokenSlot *s = &tokens->slot[i];
		Datum		values[11];
		bool		nulls[11] = {0};

		if (s->dboid != MyDatabaseId)
			continue;
		values[0] = CStringGetTextDatum(s->token_endpoint);
		values[1] = CStringGetTextDatum(s->client_id);
		values[2] = CStringGetTextDatum(s->scope);
		nulls[2] = s->scope[0] == '\0';
		values[3] = CStringGetTextDatum(s->audience);
		nulls[3] = s->audience[0] == '\0';
		values[4] = TimestampTzGetDatum(s->obtained_at);
		nulls[4] = s->len == 0;
		values[5] = TimestampTzGetDatum(s->expires_at);
		nulls[5] = s->len == 0;
		values[6] = TimestampTzGetDatum(s->refresh_at);
		nulls[6] = s->len == 0;
		values[7] = Int64GetDatum(s->requests);
		values[8] = Int64GetDatum(s->failures);
		values[9] = TimestampTzGetDatum(s->failed_at);
		nulls[9] = s->failed_at == 0;
		values[10] = CStringGetTextDatum(s->error);
		nulls[10] = s->error[0] == '\0';
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	LWLockRelease(tokens->lock);
	return (Datum) 0;
}
