/*
 * delivery_auth.c - bearer tokens on a delivery worker's requests (SPEC
 * section 12: OAuth 2.0 client credentials, Microsoft Entra ID).
 *
 * A token is asked for again a little before it stops serving, while it
 * still serves (http/token.c), so requests wait only for a database's
 * first token and after a token was dropped.
 *
 * A subscription with delivery authentication has its credentials loaded
 * once per change (eg_auth_for, in the claim's unit of work); subscriptions
 * with the same token endpoint, client, scope and audience share one
 * EgTokenUse, and the workers of a database share the token itself through
 * shared memory (http/token.c).  A worker keeps the credentials of at most
 * EG_SUBSCRIPTION_CACHE_MAX subscriptions (least recently used out); a use
 * no cached subscription names is retired, freed once the claims whose
 * requests may name it are gone (subscription_cache.c).  A request of such
 * a subscription waits in its host's queue while its token is asked for
 * (the queue passes it over: other requests, of other subscriptions, go
 * meanwhile); the token request
 * is sent through the HTTP thread like a delivery, so it never holds one
 * up.  A token that cannot be had fails the requests waiting for it, each
 * an attempt with the token endpoint's answer as its error
 * (eg_delivery_token_failed).  The token goes in the request's
 * Authorization header only when the request is handed to HTTP
 * (eg_auth_attach): a copy that the HTTP thread clears and frees.  A 401
 * drops the token; to a token that was not new for the request, it also
 * sends the request again at once, with a new one (eg_auth_refused).
 */
#include "delivery/auth.h"
#include "delivery/delivery.h"
#include "delivery/subscription_cache.h"

#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#define EG_TOKEN_LOG_INTERVAL_US ((TimestampTz) 60 * USECS_PER_SEC)

/* One set of credentials as this worker uses them. */
typedef struct EgTokenUse
{
	EgCredentials cred;			/* texts in TopMemoryContext; the secret cleared when replaced */
	char	   *auth_line;		/* "Authorization: Bearer <token>" (TopMemoryContext), or NULL */
	uint64		generation;		/* of that token */
	TimestampTz refresh_at;		/* it serves until then */
	TimestampTz renew_at;		/* the next is asked for from then on (if no other process does) */
	EgRequest  *fetch;			/* this worker's token request in flight, or NULL */
	uint64		checked_round;	/* shared memory was looked at in this round */
	EgAuthState checked;		/* and said this */
	char		error[EG_TOKEN_ERROR_MAX];	/* the last token request's failure */
	TimestampTz logged_at;		/* a failure was last logged then */
	int			entries;		/* subscriptions of the cache (auths) that name it */
	struct EgTokenUse *next;
} EgTokenUse;

/* subscription id -> the credentials set at set_at */
typedef struct AuthEntry
{
	EgSubscriptionCacheEntry key;	/* subscription id */
	TimestampTz set_at;
	EgTokenUse *use;			/* kept in uses: requests in flight may name it */
	char	   *entra_tenant;	/* Entra ID's tenant (TopMemoryContext), or NULL */
} AuthEntry;

static void release_use(EgTokenUse *u);

static void
evict_auth(void *entry)
{
	AuthEntry  *e = entry;

	if (e->entra_tenant != NULL)
		pfree(e->entra_tenant);
	e->entra_tenant = NULL;
	if (e->use != NULL)
		release_use(e->use);
	e->use = NULL;
}

static EgSubscriptionCache auths = {
	"eventgrid delivery authentications", sizeof(AuthEntry), evict_auth
};
static EgTokenUse *uses = NULL;
static uint64 round_no = 1;
static TimestampTz round_now = 0;
static EgToken *looked_up = NULL;	/* a token copied out of shared memory (16 kB: not on the stack) */

static char *
top_strdup(const char *s)
{
	return s != NULL ? MemoryContextStrdup(TopMemoryContext, s) : NULL;
}

static void
clear_free(char *s)
{
	if (s == NULL)
		return;
	explicit_bzero(s, strlen(s));
	pfree(s);
}

/* Frees u, a retired use, unless its token request is in flight (false: asked again later). */
static bool
free_use(void *item)
{
	EgTokenUse *u = item;

	if (u->fetch != NULL)
		return false;
	clear_free(u->auth_line);
	clear_free((char *) u->cred.client_secret);
	clear_free((char *) u->cred.token_endpoint);
	clear_free((char *) u->cred.client_id);
	clear_free((char *) u->cred.scope);
	clear_free((char *) u->cred.audience);
	pfree(u);
	return true;
}

/*
 * A subscription of the cache no longer names u: once none does, u leaves
 * the list of uses and is retired (requests of live claims may still name
 * it; its token stays in shared memory for the next use of the same
 * credentials).
 */
static void
release_use(EgTokenUse *u)
{
	EgTokenUse **p;

	if (--u->entries > 0)
		return;
	for (p = &uses; *p != NULL; p = &(*p)->next)
		if (*p == u)
		{
			*p = u->next;
			break;
		}
	u->next = NULL;
	eg_retire(u, free_use);
}

/* The EgTokenUse of credentials c, made when first needed; c's secret replaces the one it had. */
static EgTokenUse *
use_of(const EgCredentials *c)
{
	EgTokenUse *u;

	for (u = uses; u != NULL; u = u->next)
		if (eg_token_same_client(&u->cred, c))
			break;
	if (u == NULL)
	{
		u = MemoryContextAllocZero(TopMemoryContext, sizeof(EgTokenUse));
		u->cred.token_endpoint = top_strdup(c->token_endpoint);
		u->cred.client_id = top_strdup(c->client_id);
		u->cred.scope = top_strdup(c->scope);
		u->cred.audience = top_strdup(c->audience);
		u->next = uses;
		uses = u;
	}
	if (u->cred.client_secret == NULL || strcmp(u->cred.client_secret, c->client_secret) != 0 ||
		strcmp(u->cred.method, c->method) != 0)
	{
		/* a token request under way keeps the texts it was made from (they are in its body) */
		clear_free((char *) u->cred.client_secret);
		u->cred.client_secret = top_strdup(c->client_secret);
		u->cred.method = strcmp(c->method, "entra") == 0 ? "entra" : "oauth2";
	}
	return u;
}

/*
 * The credentials a subscription's delivery authentication row names (its
 * texts; Entra ID's token endpoint made under eventgrid.entra_authority,
 * palloc'd).  For the delivery workers and the upkeep worker's handshakes.
 */
void
eg_auth_credentials(const EgAuthRow *row, EgCredentials *c)
{
	c->method = row->method;
	c->token_endpoint = strcmp(row->method, "entra") == 0 ? eg_entra_token_endpoint(row->tenant_id)
		: row->token_endpoint;
	c->client_id = row->client_id;
	c->client_secret = row->client_secret;
	c->scope = row->scope;
	c->audience = row->audience;
}

/*
 * The credentials of subscription sub_id as set at set_at (0: it has
 * none: NULL), loaded in this claim's unit of work when new or changed.
 */
EgTokenUse *
eg_auth_for(int64 sub_id, TimestampTz set_at)
{
	AuthEntry  *e;
	bool		found;
	EgAuthRow	row;
	EgCredentials c;
	EgTokenUse *u;

	e = eg_subscription_cache_entry(&auths, sub_id, set_at, &found);
	if (e == NULL)
		return NULL;
	if (!found)
	{
		e->set_at = 0;			/* loaded below; an ERROR meanwhile leaves it to be loaded again */
		e->use = NULL;
		e->entra_tenant = NULL;
	}
	if (found && e->set_at == set_at)
	{
		char	   *endpoint;
		bool		same;

		if (e->entra_tenant == NULL)
			return e->use;
		/* eventgrid.entra_authority may have changed since (a reload) */
		endpoint = eg_entra_token_endpoint(e->entra_tenant);
		same = strcmp(endpoint, e->use->cred.token_endpoint) == 0;
		pfree(endpoint);
		if (same)
			return e->use;
	}
	if (e->entra_tenant != NULL)
		pfree(e->entra_tenant);
	e->entra_tenant = NULL;
	/*
	 * Read in a snapshot no older than the claim's: removed since the claim
	 * read it, none; replaced, the new credentials (which the next claim
	 * names).
	 */
	if (set_at == 0 || !eg_store_delivery_authentication(sub_id, &row))
	{
		evict_auth(e);
		eg_subscription_cache_remove(&auths, sub_id);
		return NULL;
	}
	eg_auth_credentials(&row, &c);
	u = use_of(&c);
	u->entries++;
	if (e->use != NULL)
		release_use(e->use);
	e->use = u;
	e->set_at = row.set_at;
	e->entra_tenant = strcmp(row.method, "entra") == 0 ? top_strdup(row.tenant_id) : NULL;
	explicit_bzero(row.client_secret, strlen(row.client_secret));
	return e->use;
}

/* A new round of sending: shared memory is looked at again (at most once a round per credentials). */
void
eg_auth_new_round(void)
{
	round_no++;
	round_now = GetCurrentTimestamp();
}

/* looked_up, made when first needed */
static EgToken *
token_buffer(void)
{
	if (looked_up == NULL)
		looked_up = MemoryContextAlloc(TopMemoryContext, sizeof(EgToken));
	return looked_up;
}

/* Takes the token looked_up holds as this worker's for u. */
static void
take_token(EgTokenUse *u)
{
	static const char prefix[] = "Authorization: Bearer ";
	char	   *line = MemoryContextAlloc(TopMemoryContext, sizeof(prefix) + looked_up->len);

	memcpy(line, prefix, sizeof(prefix) - 1);
	memcpy(line + sizeof(prefix) - 1, looked_up->text, looked_up->len + 1);
	explicit_bzero(looked_up->text, looked_up->len);
	clear_free(u->auth_line);
	u->auth_line = line;
	u->generation = looked_up->generation;
	u->refresh_at = looked_up->refresh_at;
	u->renew_at = looked_up->renew_at;
}

/* Sends a token request for u through the HTTP thread. */
static void
start_fetch(EgTokenUse *u)
{
	EgRequest  *req = MemoryContextAlloc(TopMemoryContext, sizeof(EgRequest));

	eg_token_request_prepare(req, &u->cred);
	req->token_use = u;
	u->fetch = req;
	eg_http_start(&req, 1, eg_response_timeout_ms);
}

/*
 * Whether request req may go now as far as its bearer token goes (always,
 * for one without delivery authentication).  Asks for a token when none
 * serves and no process of the database is asking; a request told to wait
 * is marked as having waited (the token it then carries is new).
 */
EgAuthState
eg_auth_state(EgRequest *req)
{
	EgTokenUse *u = req->token_use;
	EgAuthState state;
	bool		serves;			/* the token this worker took serves still */

	if (u == NULL)
		return EG_AUTH_READY;
	/* one answer per round for all requests of the credentials: they keep their order */
	if (u->checked_round == round_no)
	{
		if (u->checked == EG_AUTH_WAIT)
			req->token_waited = true;
		return u->checked;
	}
	serves = u->auth_line != NULL && round_now < u->refresh_at;
	if (serves && (round_now < u->renew_at || u->fetch != NULL))
		return EG_AUTH_READY;	/* (the same for the whole round: nothing here changes within one) */
	if (u->fetch != NULL)
		state = EG_AUTH_WAIT;
	else
	{
		switch (eg_token_lookup(&u->cred, token_buffer(), true))
		{
			case EG_TOKEN_READY:
				take_token(u);
				state = EG_AUTH_READY;
				break;
			case EG_TOKEN_READY_RENEW:
				take_token(u);
				start_fetch(u);
				state = EG_AUTH_READY;	/* this token serves while the next is asked for */
				break;
			case EG_TOKEN_FETCH:
				start_fetch(u);
				/* the token taken when this worker's last request ended may still serve */
				state = serves ? EG_AUTH_READY : EG_AUTH_WAIT;
				break;
			case EG_TOKEN_FETCHING:
				state = serves ? EG_AUTH_READY : EG_AUTH_WAIT;
				break;
			default:
				strlcpy(u->error, looked_up->error, sizeof(u->error));
				state = EG_AUTH_FAILED;
				break;
		}
	}
	u->checked_round = round_no;
	u->checked = state;
	if (state == EG_AUTH_WAIT)
		req->token_waited = true;
	return state;
}

/* Why request req could get no token (EG_AUTH_FAILED). */
const char *
eg_auth_error(const EgRequest *req)
{
	return req->token_use != NULL ? req->token_use->error : "";
}

/*
 * Request req is handed to HTTP now (eg_auth_state said READY in this
 * round): it carries a copy of its token, which the HTTP thread clears
 * and frees when it ends.
 */
void
eg_auth_attach(EgRequest *req)
{
	EgTokenUse *u = req->token_use;

	if (u == NULL || u->auth_line == NULL)
		return;
	req->auth_line = strdup(u->auth_line);
	req->token_generation = u->generation;
	/* without memory for the copy it goes without a token; its 401 sends it again */
}

/*
 * A token request this worker sent has ended: the token is shared (or the
 * failure, which fails the requests waiting for it as they are looked at),
 * and the request freed.
 */
void
eg_auth_token_finished(EgRequest *req)
{
	EgTokenUse *u = req->token_use;
	char	   *token;
	int			len;
	int64		expires_in;
	char		error[EG_TOKEN_ERROR_MAX];

	u->fetch = NULL;
	u->checked_round = 0;
	if (eg_token_answer(&u->cred, req, &token, &len, &expires_in, error, sizeof(error)))
	{
		eg_token_store(&u->cred, token, len, expires_in, token_buffer());
		explicit_bzero(token, len);
		pfree(token);
		/* this worker's requests go with it even if its slot is another's by the next round */
		if (looked_up->len > 0)
			take_token(u);
		ereport(DEBUG1,
				(errmsg("eventgrid: got a bearer token from %s for client \"%s\", good for " INT64_FORMAT " s",
						u->cred.token_endpoint, u->cred.client_id, expires_in)));
	}
	else
	{
		eg_token_failed(&u->cred, error);
		strlcpy(u->error, error, sizeof(u->error));
		if (GetCurrentTimestamp() - u->logged_at >= EG_TOKEN_LOG_INTERVAL_US)
		{
			u->logged_at = GetCurrentTimestamp();
			ereport(LOG,
					(errmsg("eventgrid: no bearer token for client \"%s\": %s", u->cred.client_id, error),
					 errdetail("Once no token serves, the deliveries that need one fail as attempts with outcome GenericError and are retried on the schedule."),
					 errhint("See the token_* columns of eventgrid.event_subscription_authentication; this is logged at most once a minute.")));
		}
	}
	if (req->answer != NULL)
	{
		explicit_bzero(req->answer, req->answer_len < req->answer_max ? req->answer_len : req->answer_max - 1);
		free(req->answer);
	}
	pfree(req);
}

/*
 * Request req was answered 401.  Its token is dropped for every worker
 * (unless one replaced it meanwhile), whatever the token's age: no later
 * request carries a token a receiver refused.  A token that was new for the
 * request (it waited for it, or was sent again after a 401 already) makes
 * the 401 the attempt's outcome (Unauthorized, SPEC 3): false.  Otherwise
 * the token was revoked or its keys rotated: true, the request is to be
 * sent again at once, with a new token.
 */
bool
eg_auth_refused(EgRequest *req)
{
	EgTokenUse *u = req->token_use;
	bool		resend;

	if (u == NULL)
		return false;
	resend = !req->token_waited && !req->token_resent;
	eg_token_drop(&u->cred, req->token_generation);
	if (u->generation == req->token_generation)
	{
		clear_free(u->auth_line);
		u->auth_line = NULL;
		u->refresh_at = 0;
	}
	u->checked_round = 0;
	if (resend)
		req->token_resent = true;
	return resend;
}
