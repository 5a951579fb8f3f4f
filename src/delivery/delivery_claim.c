/*
 * delivery_claim.c - a delivery worker's claim (SPEC sections 2, 4, 5 and
 * 8): due retries and, from each event subscription's position, the next
 * chunk of first attempts, as many as eventgrid.max_bytes_in_flight leaves
 * (store_claim.c), turned into requests in the same unit of work: one
 * event each, or batches when the subscription batches, built from the
 * claim's texts.  Deliveries that may not be attempted (time-to-live run
 * out, attempts used up, subscription gone, an unsendable header) end
 * without a request.  The requests are queued on their endpoint hosts only
 * once the claim has committed, before any network I/O.
 */
#include "delivery/delivery.h"
#include "delivery/subscription_cache.h"
#include "delivery/auth.h"
#include "http/rabbitmq.h"
#include "http/storage_queue.h"
#include "http/signing.h"
#include "delivery/endpoint.h"
#include "store/worker.h"

#include "utils/memutils.h"
#include "utils/timestamp.h"

#define EG_CLAIM_MAX_ROWS 1000	/* retries per claim */
#define EG_CHUNK_MAX_ROWS 1000	/* first attempts per subscription per claim */
#define EG_LEASE_MARGIN_MS 60000
#define EG_ANALYZE_INTERVAL_MS 60000
#define EG_CHUNK_MIN_ROWS 64		/* the least a claim reads of each subscription's events */
#define EG_CLAIM_MIN_POSITIONS 16	/* the fewest positions a claim looks at (if it has as many) */

/* a request is allocated in its claim's context: 1 kB, not a 2 kB chunk (http.h) */
StaticAssertDecl(sizeof(EgRequest) <= 1024, "EgRequest must fit a 1 kB allocation chunk");

/* positions that had events at the last claim, and the events they gave (claim_size) */
static int	busy_positions = 1;
static int	busy_rows = 0;

/*
 * Client certificates (mutual TLS), loaded once per change: subscription
 * id -> the certificate set at set_at.  A replaced or evicted one is
 * retired (subscription_cache.c): requests of the claims alive then point
 * at it until libcurl copies it as they start.
 */
typedef struct ClientCertEntry
{
	EgSubscriptionCacheEntry key;	/* subscription id */
	TimestampTz set_at;
	EgClientCert *cert;
} ClientCertEntry;

static bool
free_client_cert(void *item)
{
	EgClientCert *c = item;

	explicit_bzero(c->key, c->key_len);
	pfree(c->key);
	pfree(c->cert);
	pfree(c);
	return true;
}

static void
evict_client_cert(void *entry)
{
	ClientCertEntry *e = entry;

	if (e->cert != NULL)
		eg_retire(e->cert, free_client_cert);
	e->cert = NULL;
}

static EgSubscriptionCache client_certs = {
	"eventgrid client certificates", sizeof(ClientCertEntry), evict_client_cert
};

/*
 * The client certificate of subscription sub_id as set at set_at (0: it has
 * none: NULL), loaded in this claim's unit of work when it is new or was
 * replaced.
 */
static const EgClientCert *
client_cert_for(int64 sub_id, TimestampTz set_at)
{
	ClientCertEntry *e;
	bool		found;
	char	   *cert;
	char	   *key;
	TimestampTz loaded_at;

	e = eg_subscription_cache_entry(&client_certs, sub_id, set_at, &found);
	if (e == NULL)
		return NULL;
	if (found && e->set_at == set_at)
		return e->cert;

	if (found)
		evict_client_cert(e);
	e->cert = NULL;
	e->set_at = set_at;
	if (set_at == 0)
	{
		eg_subscription_cache_remove(&client_certs, sub_id);
		return NULL;
	}
	/*
	 * Read in a snapshot no older than the claim's: removed since the claim
	 * read it, none; replaced, the new one (which the next claim names).
	 */
	if (!eg_store_client_certificate(sub_id, &cert, &key, &loaded_at))
	{
		eg_subscription_cache_remove(&client_certs, sub_id);
		return NULL;
	}
	e->set_at = loaded_at;
	e->cert = MemoryContextAlloc(TopMemoryContext, sizeof(EgClientCert));
	e->cert->cert_len = strlen(cert);
	e->cert->cert = MemoryContextStrdup(TopMemoryContext, cert);
	e->cert->key_len = strlen(key);
	e->cert->key = MemoryContextStrdup(TopMemoryContext, key);
	explicit_bzero(key, e->cert->key_len);
	return e->cert;
}

/*
 * How much a claim reads, from what the byte budget could take (taking the
 * smallest a delivery can be, EG_DELIVERY_OVERHEAD_BYTES, so it reads
 * rather too many than too few; what it leaves is read at the next claim,
 * at once).  Of each subscription: that shared among the subscriptions
 * that had events last time, between EG_CHUNK_MIN_ROWS and
 * EG_CHUNK_MAX_ROWS (reading 1,000 rows of every one of 128 busy
 * subscriptions for a budget of a few thousand deliveries only cost memory
 * and time).  Of how many positions: as many as the budget could take at
 * the events each gave last time, at least EG_CLAIM_MIN_POSITIONS; the
 * others wait for their turn, at the next claim.  A domain's events spread
 * over 1,000 domain topics are then taken many of a domain topic at a
 * time, a chunk and a position moved for each many, rather than a few of
 * each of the 1,000 (SPEC 20).
 */
static EgClaimSize
claim_size(int64 budget)
{
	int64		budget_rows = Max(budget, 0) / EG_DELIVERY_OVERHEAD_BYTES;
	int64		rows = budget_rows / Max(busy_positions, 1);
	int64		each = Max(busy_rows / Max(busy_positions, 1), 1);
	EgClaimSize size;

	size.rows_per_position = (int) Max(EG_CHUNK_MIN_ROWS, Min(rows, EG_CHUNK_MAX_ROWS));
	size.positions = (int) Max(EG_CLAIM_MIN_POSITIONS, Min(budget_rows / each, INT_MAX));
	size.busy = size.scanned = 0;
	return size;
}

/* Adds req to the requests built by the claim, in order. */
static void
append_built(EgRequest *req)
{
	req->next = NULL;
	if (eg_dw.built_tail)
		eg_dw.built_tail->next = req;
	else
		eg_dw.built_head = req;
	eg_dw.built_tail = req;
}

/* Frees requests that were built but will never be started. */
static void
free_built_requests(void)
{
	while (eg_dw.built_head)
	{
		EgRequest  *next = eg_dw.built_head->next;

		eg_http_free_body(eg_dw.built_head);
		eg_dw.built_head = next;
	}
	eg_dw.built_tail = NULL;
}

/* Where one subscription's requests go (SPEC 21), set up once per run of its rows. */
typedef enum DestinationKind
{
	DEST_WEBHOOK,
	DEST_REDIS_STREAM,
	DEST_STORAGE_QUEUE,
	DEST_RABBITMQ
} DestinationKind;

typedef struct Destination
{
	DestinationKind kind;
	EgRedisDest redis;
	EgStorageQueue storage;
	EgAmqpDest	amqp;
	char	   *cred_kind;		/* destination_credentials: password, sas or shared_key; NULL: none */
	char	   *cred_user;
	char	   *cred_secret;
	char	   *put_url;		/* a Storage queue's Put Message URL (in the claim's context; may hold a SAS token) */
} Destination;

/*
 * The destination of a subscription's rows (first: one of them): its kind
 * by endpoint_type, its endpoint parsed, and its credentials read in the
 * claim's unit of work.  A webhook has none of these.  NULL, or why its
 * endpoint does not parse (the table's constraints take only endpoints
 * that do: a second line of defence, whose rows are not sent).
 */
static const char *
destination_open(Destination *dest, EgClaim *claim, const EgClaimedRow *first)
{
	const char *problem = NULL;

	memset(dest, 0, sizeof(Destination));
	if (first->endpoint_type != NULL && strcmp(first->endpoint_type, "RedisStream") == 0)
	{
		dest->kind = DEST_REDIS_STREAM;
		problem = eg_redis_parse(first->endpoint, &dest->redis);
	}
	else if (first->endpoint_type != NULL && strcmp(first->endpoint_type, "StorageQueue") == 0)
	{
		dest->kind = DEST_STORAGE_QUEUE;
		problem = eg_storage_parse(first->endpoint, &dest->storage);
	}
	else if (first->endpoint_type != NULL && strcmp(first->endpoint_type, "RabbitMQ") == 0)
	{
		dest->kind = DEST_RABBITMQ;
		problem = eg_amqp_parse(first->endpoint, &dest->amqp);
	}
	else
		return NULL;
	if (problem != NULL)
		return problem;
	eg_store_destination_credentials(first->subscription_id, &dest->cred_kind, &dest->cred_user, &dest->cred_secret);
	if (dest->kind == DEST_STORAGE_QUEUE)
	{
		char	   *url = eg_storage_put_url(first->endpoint, &dest->storage,
											 dest->cred_kind && strcmp(dest->cred_kind, "sas") == 0
											 ? dest->cred_secret : NULL);

		dest->put_url = MemoryContextStrdup(claim->cxt, url);
		explicit_bzero(url, strlen(url));
		pfree(url);
	}
	return NULL;
}

/*
 * req's body and headers for the events (one, but for a RabbitMQ batch) of
 * a destination that is not a webhook (a Redis stream entry; a Storage
 * queue message, sent to its Put URL; a RabbitMQ message); EG_OUTCOME_NONE
 * or why it may not be sent.
 */
static EgOutcomeCode
destination_build(Destination *dest, EgRequest *req, const char *schema, const char *event_id,
				  const EgEventPart *event, int nevents, const char *ordering_key, StringInfo scratch)
{
	EgOutcomeCode problem;

	if (dest->kind == DEST_RABBITMQ)
	{
		problem = eg_amqp_request_build(req, &dest->amqp, schema, event_id, event, nevents, ordering_key,
										scratch);
		if (problem == EG_OUTCOME_NONE && dest->cred_secret != NULL)
			eg_amqp_request_auth(req, dest->cred_user, dest->cred_secret);
		return problem;
	}
	if (dest->kind == DEST_REDIS_STREAM)
	{
		problem = eg_redis_request_build(req, &dest->redis, event_id, event, ordering_key);
		if (problem == EG_OUTCOME_NONE && dest->cred_secret != NULL)
			eg_redis_request_auth(req, dest->cred_user, dest->cred_secret);
		return problem;
	}
	return eg_storage_request_build(req, &dest->storage,
									dest->cred_kind && strcmp(dest->cred_kind, "shared_key") == 0
									? dest->cred_secret : NULL, event, scratch);
}

/* The secrets read for the destination are cleared (its Put URL lives on with the claim). */
static void
destination_close(Destination *dest)
{
	if (dest->cred_secret != NULL)
		explicit_bzero(dest->cred_secret, strlen(dest->cred_secret));
}

/*
 * The claimed rows [from, to) of one subscription become requests: rows
 * that cannot be attempted are finished at once; the others go in batches
 * (or one by one) built from the claim's texts, which are not copied again.
 */
static void
build_requests(EgClaim *claim, EgClaimedRow *rows, int from, int to, StringInfo scratch)
{
	EgDelivery **send = palloc(sizeof(EgDelivery *) * (to - from));
	EgEventPart *parts = palloc(sizeof(EgEventPart) * (to - from));
	int		   *rowno = palloc(sizeof(int) * (to - from));
	int			nsend = 0;
	int			max_events = 1;
	int64		max_bytes = 0;
	EgTarget   *target = NULL;
	Destination dest;
	const EgClientCert *client_cert;
	struct EgTokenUse *token_use;
	const char *unusable = destination_open(&dest, claim, &rows[from]);

	/* a broker has no HTTP; a Storage queue takes a bearer token when it has no key or SAS token */
	client_cert = dest.kind != DEST_WEBHOOK ? NULL :
		client_cert_for(rows[from].subscription_id, rows[from].client_cert_set_at);
	token_use = dest.kind == DEST_REDIS_STREAM || dest.kind == DEST_RABBITMQ || dest.cred_kind != NULL ? NULL :
		eg_auth_for(rows[from].subscription_id, rows[from].auth_set_at);

	for (int k = from; k < to; k++)
	{
		EgDelivery *d = &claim->rows[k];

		EgFinalReason reason;
		EgAction	action = eg_before_attempt(d->out.subscription_id == 0, rows[k].expired,
											   d->attempts, d->max_attempts, &reason);

		if (action != EG_ACTION_UNDECIDED)
			eg_delivery_finish_unattempted(d, action, reason, EG_OUTCOME_NONE);
		else if (unusable != NULL)
			eg_delivery_finish_unattempted(d, EG_ACTION_FINAL, EG_REASON_NON_RETRIABLE, EG_OUTCOME_INVALID_HEADER);
		else
		{
			/* its key waits in the retries (SPEC 13): it goes behind, unsent, in its turn */
			d->claim_parked = rows[k].parked && d->keyed;
			parts[nsend] = rows[k].payload;
			rowno[nsend] = k;
			send[nsend++] = d;
		}
	}
	if (unusable != NULL)
		ereport(LOG,
				(errmsg("eventgrid: the endpoint of event subscription \"%s\" is not a %s endpoint: %s",
						rows[from].subscription_name, rows[from].endpoint_type, unusable),
				 errdetail("Its events due in this claim were dead-lettered or dropped with outcome InvalidHeader.")));
	/*
	 * a stream entry or a queue message is one event: a Redis stream's
	 * requests are pipelined instead; a RabbitMQ message may be a batch
	 * (unless each event's subject or ordering key is its routing key)
	 */
	if ((dest.kind == DEST_WEBHOOK || (dest.kind == DEST_RABBITMQ && dest.amqp.routing_key_from == EG_KEY_FIXED))
		&& (rows[from].max_events_per_batch > 0 || rows[from].preferred_batch_kb > 0))
	{
		max_events = rows[from].max_events_per_batch > 0
			? rows[from].max_events_per_batch : eg_default_max_events_per_batch;
		max_bytes = (int64) 1024 * (rows[from].preferred_batch_kb > 0
									? rows[from].preferred_batch_kb : eg_default_preferred_batch_kb);
	}
	for (int k = 0; k < nsend;)
	{
		int			run = 0;
		int			take;
		EgClaimedRow *first = &rows[rowno[k]];
		EgRequest  *req = MemoryContextAllocZero(claim->cxt, sizeof(EgRequest));
		EgRequestSpec spec;
		EgOutcomeCode unsendable;

		if (send[k]->claim_parked)
		{
			/* a request that is never sent: it holds the row's place in its key's order (ordering.c) */
			req->subscription_id = first->subscription_id;
			req->items = MemoryContextAlloc(claim->cxt, sizeof(void *));
			req->items[0] = send[k];
			req->count = 1;
			append_built(req);
			k++;
			continue;
		}
		while (k + run < nsend && !send[k + run]->claim_parked)
			run++;
		take = eg_batch_take(&parts[k], run, max_events, max_bytes);

		spec.schema = first->schema;
		spec.subscription_name = first->subscription_name;
		spec.delivery_count = first->attempts;
		spec.output_event_id = first->output_event_id;
		spec.data_version = first->data_version;
		spec.metadata_version = first->metadata_version;
		spec.custom_headers = first->custom_headers;
		spec.signing_keys = first->signing_keys;
		spec.webhook_id = NULL;
		if (spec.signing_keys && dest.kind == DEST_WEBHOOK)
		{
			int64	   *ids = palloc(sizeof(int64) * take);

			for (int j = 0; j < take; j++)
				ids[j] = send[k + j]->out.event_id;
			spec.webhook_id = eg_webhook_id(first->subscription_id, ids, take);
			pfree(ids);
		}
		if (dest.kind != DEST_WEBHOOK)
			unsendable = destination_build(&dest, req, first->schema, first->output_event_id, &parts[k], take,
										   first->ordering_key, scratch);
		else
			unsendable = eg_request_build(req, &spec, &parts[k], take, scratch);
		if (unsendable == EG_OUTCOME_NONE)
		{
			if (target == NULL)
				target = eg_target(first->endpoint);	/* one subscription: one endpoint */
			req->target = target;
			/* a Storage queue's requests go to its Put URL; the target (health, logs) is the endpoint */
			req->url = dest.put_url ? dest.put_url : eg_target_url(target);
			req->client_cert = client_cert;
			req->token_use = token_use;
			req->keep_body = token_use != NULL;	/* a 401 may send it again */
			req->subscription_id = first->subscription_id;
			req->subscription_name = MemoryContextStrdup(claim->cxt, first->subscription_name);
			req->topic = MemoryContextStrdup(claim->cxt, first->topic);
			req->items = MemoryContextAlloc(claim->cxt, sizeof(void *) * take);
			memcpy(req->items, &send[k], sizeof(void *) * take);
			req->count = take;
			append_built(req);
		}
		else
		{
			/*
			 * second line of defence: a header line an event would corrupt,
			 * or text with no UTF-8 form (a SQL_ASCII database's bytes)
			 */
			for (int j = k; j < k + take; j++)
				eg_delivery_finish_unattempted(send[j], EG_ACTION_FINAL, EG_REASON_NON_RETRIABLE, unsendable);
			ereport(LOG,
					(errmsg("eventgrid: a delivery request of event subscription \"%s\" was not sent: %s",
							first->subscription_name,
							unsendable == EG_OUTCOME_INVALID_ENCODING
							? "its body or a header value has no UTF-8 form"
							: dest.kind == DEST_RABBITMQ ? "its subject, its routing key, is over 255 bytes"
							: dest.kind == DEST_REDIS_STREAM ? "it has no subject to name its stream, or one over 512 bytes"
							: "a header value holds a control character"),
					 errdetail("%d events were dead-lettered or dropped with outcome %s.", take,
							   eg_outcome_name(unsendable))));
		}
		k += take;
	}
	destination_close(&dest);
	pfree(send);
	pfree(parts);
	pfree(rowno);
}

/*
 * Charges each row of a claim its share of what the claim now holds, so
 * that eventgrid.max_bytes_in_flight bounds the worker's memory rather
 * than an estimate of it: the claim's memory context (rows, delivery and
 * request records, their strings, the context's free space) and the
 * malloc'd body and header block of each request built, shared evenly
 * (the first row takes the remainder).  The claim's texts are gone by
 * now (they lived in its unit of work); the store's estimate of each row
 * (the event's bytes and EG_DELIVERY_OVERHEAD_BYTES) only sized the claim.
 * Each request's bytes become the sum of its rows' (endpoint_queue.c
 * counts what waits on a backed-up host with them).
 */
static void
charge_claim(EgClaim *claim, int n)
{
	int64		total = (int64) MemoryContextMemAllocated(claim->cxt, true);

	for (EgRequest *req = eg_dw.built_head; req != NULL; req = req->next)
		total += (int64) req->body_len + (int64) req->headers_size;
	for (int i = 0; i < n; i++)
		claim->rows[i].bytes = total / n;
	claim->rows[0].bytes += total - (total / n) * n;
	for (EgRequest *req = eg_dw.built_head; req != NULL; req = req->next)
	{
		req->bytes = 0;
		for (int k = 0; k < req->count; k++)
			req->bytes += ((EgDelivery *) req->items[k])->bytes;
	}
}

/*
 * The bookkeeping of a claim of n rows: a delivery per row, and a chunk
 * per run of first attempts with the same chunk number (rows come ordered
 * by chunk).
 */
static EgClaim *
new_claim(const EgClaimedRow *rows, int n)
{
	EgClaim    *claim;

	claim = MemoryContextAllocZero(TopMemoryContext, sizeof(EgClaim));
	claim->cxt = AllocSetContextCreate(TopMemoryContext, "eventgrid claim", ALLOCSET_DEFAULT_SIZES);
	claim->rows = MemoryContextAllocZero(claim->cxt, n * sizeof(EgDelivery));
	claim->unrecorded = n;
	claim->no = ++eg_dw.claims_made;
	dlist_push_tail(&eg_dw.claims_alive, &claim->alive);
	for (int i = 0; i < n; i++)
	{
		EgDelivery *d = &claim->rows[i];

		d->claim = claim;
		if (rows[i].chunk != 0)
		{
			if (i == 0 || rows[i - 1].chunk != rows[i].chunk)
			{
				d->chunk = MemoryContextAllocZero(claim->cxt, sizeof(EgChunk));
				d->chunk->no = rows[i].chunk;
				d->chunk->subscription_id = rows[i].subscription_id;
				d->chunk->ordered = rows[i].ordered;
			}
			else
				d->chunk = claim->rows[i - 1].chunk;
			d->chunk->undecided++;
			d->chunk->count++;
		}
		d->out.retry_id = rows[i].retry_id;
		d->out.subscription_id = rows[i].subscription_id;
		d->out.txid = rows[i].txid;
		d->out.event_id = rows[i].event_id;
		d->out.publish_time = rows[i].publish_time;
		d->out.duration_ms = -1;
		d->attempts = rows[i].attempts;
		d->max_attempts = rows[i].max_attempts;
		d->profile = rows[i].profile;
		d->bytes = rows[i].bytes;
		d->prev_outcome = rows[i].prev_outcome;
		d->prev_http_status = rows[i].prev_http_status;
		d->prev_attempted_at = rows[i].prev_attempted_at;
		d->source = rows[i].source ? MemoryContextStrdup(claim->cxt, rows[i].source) : NULL;
		d->keyed = rows[i].chunk != 0 && rows[i].keyed;
		d->key_hash = d->keyed ? rows[i].key_hash : 0;
	}
	return claim;
}

static int
cmp_event_id(const void *a, const void *b)
{
	int64		x = ((const EgClaimedRow *) a)->event_id;
	int64		y = ((const EgClaimedRow *) b)->event_id;

	return x < y ? -1 : x > y ? 1 : 0;
}

/* An ordered subscription's chunk goes in publish order: by id (see store/store_batch_order.c). */
static void
order_chunks(EgClaimedRow *rows, int n)
{
	for (int i = 0; i < n;)
	{
		int			j = i;

		while (j < n && rows[j].chunk == rows[i].chunk)
			j++;
		if (rows[i].ordered)
			qsort(&rows[i], j - i, sizeof(EgClaimedRow), cmp_event_id);
		i = j;
	}
}

/*
 * The claim of n rows has committed: rows finished without an attempt are
 * recorded, and the requests may go, an ordered subscription's each once
 * the earlier ones of its keys are decided (ordering.c); a row whose key
 * waits in the retries goes there, unsent, in its turn.
 */
static void
hand_over(EgClaim *claim, int n)
{
	for (int i = 0; i < n; i++)
	{
		EgDelivery *d = &claim->rows[i];

		eg_dw.bytes_held += d->bytes;
		if (d->chunk != NULL && d->chunk->ordered && (i == 0 || claim->rows[i - 1].chunk != d->chunk))
			eg_ordering_chunk_claimed(d->chunk);
		if (d->out.action != EG_ACTION_UNDECIDED)
			eg_delivery_push(d);
	}
	eg_dw.claim_in_progress = NULL;
	while (eg_dw.built_head)
	{
		EgRequest  *req = eg_dw.built_head;

		eg_dw.built_head = req->next;
		switch (eg_ordering_admit(req))
		{
			case EG_ORDER_GO:
				eg_target_queue(req);
				break;
			case EG_ORDER_WAIT:
				break;
			case EG_ORDER_PARK:
				eg_delivery_put_back(req, EG_ACTION_WAIT);
				break;
		}
	}
	eg_dw.built_tail = NULL;
}

/* the last claim took retries: more are likely due */
static bool last_claim_had_retries = false;

/*
 * Claims due retries and first attempts, within byte_budget event bytes,
 * and turns them into queued requests.  Returns the number claimed, or -1
 * when the extension is not ready; *more says that more is ready at once,
 * *locked that another session holds what would be claimed, *next_due_at
 * when the next retry is due if no retry was due (then the retry claim,
 * whose executor start-up alone was a sixth of a worker's time at a low
 * rate, is not run), otherwise 0 (unknown: ask eg_store_next_due()).
 */
int
eg_delivery_claim(int64 byte_budget, bool *more, bool *locked, TimestampTz *next_due_at)
{
	EgClaim    *claim;
	EgClaimedRow *rrows;
	EgClaimedRow *frows;
	EgClaimedRow *rows;
	int			nr;
	int			nf;
	int			n;
	int64		retry_bytes = 0;
	TimestampTz due;
	StringInfoData scratch;
	int64	   *skip;
	int			nskip = eg_targets_skip_list(&skip);
	bool		transfer_locked;
	EgClaimCandidates cand;
	EgClaimSize size;

	/* subscriptions whose outcomes cannot be recorded claim nothing new meanwhile */
	if (eg_dw.poisoned_n > 0)
	{
		skip = nskip == 0 ? palloc(eg_dw.poisoned_n * sizeof(int64))
			: repalloc(skip, (nskip + eg_dw.poisoned_n) * sizeof(int64));
		memcpy(skip + nskip, eg_dw.poisoned, eg_dw.poisoned_n * sizeof(int64));
		nskip += eg_dw.poisoned_n;
	}

	*more = false;
	*locked = false;
	*next_due_at = 0;
	eg_pause_point("claim-begin");	/* tests: before the claim's first snapshot */
	if (!eg_begin_work("eventgrid: claiming deliveries"))
		return -1;

	/*
	 * A claim lost in a crash only means claiming again (nothing of it was
	 * sent before a later, durable in-flight record): no need to wait for
	 * the flush.
	 */
	eg_store_no_flush_wait();
	/*
	 * Ordered subscriptions' new events become their retries first, to be
	 * claimed there (queue subscriptions' become receivable).  Retries are
	 * due when some were moved or the last claim found some: then the look
	 * for the next due time (an index scan past the retries finished since
	 * the last VACUUM, a fifth of an ordered drain's claims: bench figure
	 * 20) is spared.
	 */
	eg_store_claim_candidates(eg_dw.lease_owner, GetCurrentTimestamp(), &cand);
	if (eg_store_transfer_positions(eg_now(), &cand, &transfer_locked) > 0 || last_claim_had_retries)
		due = 0;
	else
		due = eg_store_next_due();
	if (due > eg_now())
	{
		*next_due_at = due;
		nr = 0;
		rrows = NULL;
	}
	else
		nr = eg_store_claim_retries(eg_now(), EG_CLAIM_MAX_ROWS, byte_budget, eg_dw.lease_owner,
									(int64) eg_response_timeout_ms + EG_LEASE_MARGIN_MS, &rrows);
	last_claim_had_retries = nr > 0;
	for (int i = 0; i < nr; i++)
		retry_bytes += rrows[i].bytes;
	/* chunk numbers of a claim that fails are not used again: no harm */
	eg_pause_point("claim-scan");	/* tests: the claim's first snapshot taken, the scan's not yet */
	size = claim_size(byte_budget - retry_bytes);
	nf = eg_store_claim_first(eg_now(), &size, Max(byte_budget - retry_bytes, 1), eg_dw.lease_owner, &cand, skip,
							  nskip, &eg_dw.next_chunk_no, &frows, more, locked);
	busy_positions = size.busy;
	busy_rows = size.scanned;
	if (nr == EG_CLAIM_MAX_ROWS)
		*more = true;
	if (transfer_locked)
		*locked = true;

	/*
	 * In-flight records of recorded waves go in the same transaction: a
	 * retry claimed again must not be named by an old one once this
	 * commits.
	 */
	eg_store_forget_waves(eg_dw.lease_owner, eg_dw.waves_done, eg_dw.waves_done_n);
	n = nr + nf;
	if (n == 0)
	{
		eg_end_work();
		eg_dw.waves_done_n = 0;
		return 0;
	}
	rows = palloc(n * sizeof(EgClaimedRow));
	if (nr > 0)
		memcpy(rows, rrows, nr * sizeof(EgClaimedRow));
	memcpy(rows + nr, frows, nf * sizeof(EgClaimedRow));

	order_chunks(rows + nr, nf);
	eg_retired_sweep();
	claim = new_claim(rows, n);
	eg_dw.claim_in_progress = claim;

	/* rows of one subscription (retries) or one chunk (first attempts) become requests */
	initStringInfo(&scratch);
	for (int i = 0; i < n;)
	{
		int			j = i;

		while (j < n && rows[j].subscription_id == rows[i].subscription_id &&
			   rows[j].chunk == rows[i].chunk)
			j++;
		build_requests(claim, rows, i, j, &scratch);
		i = j;
	}
	pfree(scratch.data);
	eg_end_work();
	charge_claim(claim, n);
	eg_dw.waves_done_n = 0;
	eg_want_upkeep();

	hand_over(claim, n);

	/* a full claim of retries means a backlog: fresh statistics, at most once a minute */
	if (nr == EG_CLAIM_MAX_ROWS && GetCurrentTimestamp() - eg_dw.last_analyze >= EG_ANALYZE_INTERVAL_MS * 1000)
	{
		eg_dw.last_analyze = GetCurrentTimestamp();
		if (eg_begin_work("eventgrid: analyzing eventgrid.retries"))
		{
			eg_store_analyze();
			eg_end_work();
		}
	}
	return n;
}


/*
 * After an ERROR in a unit of work: a claim being built is dropped (its
 * leases rolled back with it), and the next one sweeps (what the claims
 * kept may not be all there is to look at again).
 */
void
eg_delivery_drop_claim(void)
{
	eg_store_claim_sweep();
	if (eg_dw.claim_in_progress == NULL)
		return;
	free_built_requests();
	eg_delivery_claim_gone(eg_dw.claim_in_progress);
	eg_dw.claim_in_progress = NULL;
}

/*
 * Claim claim is gone (every row recorded, or its transaction failed): its
 * memory, and with it its requests, freed.
 */
void
eg_delivery_claim_gone(EgClaim *claim)
{
	dlist_delete(&claim->alive);
	MemoryContextDelete(claim->cxt);
	pfree(claim);
}

/*
 * The number of the oldest claim still alive (eg_dw.claims_made + 1 when
 * none is): what a claim's requests point at (client certificates, bearer
 * token uses) may be freed once every claim up to the last one made when
 * it was let go is gone (subscription_cache.c).
 */
uint64
eg_delivery_oldest_claim(void)
{
	if (dlist_is_empty(&eg_dw.claims_alive))
		return eg_dw.claims_made + 1;
	return dlist_head_element(EgClaim, alive, &eg_dw.claims_alive)->no;
}
