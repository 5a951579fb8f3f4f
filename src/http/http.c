/*
 * http.c - delivery requests through libcurl's multi interface, on a thread
 * of their own: many POSTs in flight, connections kept alive and reused, only
 * http and https, no redirects, response bodies discarded as they arrive
 * (but for their first 512 bytes, which a failed attempt's history keeps), a
 * total time limit per request (SPEC section 3's 30 s).
 *
 * HTTPS: certificates are always verified (peer and host name), against
 * the system's CA store or the PEM bundle eventgrid.ssl_ca_file names;
 * nothing turns verification off.  TLS sessions are shared by all of the
 * worker's transfers (a libcurl share handle), so a new connection to a
 * host resumes a session instead of a full handshake; connections are kept
 * in the multi handle's pool across claims.  HTTP/2 is used when the
 * endpoint offers it by ALPN, its requests multiplexed over one connection
 * once it is up; HTTP/1.1 otherwise.  Requests started before a host's
 * first connection is up would each open a connection of their own, so
 * endpoint_queue.c sends a new HTTPS host one request first and the rest
 * once its answer came (the answer's HTTP version is kept in the request).
 * (CURLOPT_PIPEWAIT, which makes a new request wait for a connection that
 * may multiplex, held requests to an HTTP/1.1 host behind one that hangs
 * there, test/t/026, and gained nothing measurable once the first
 * connection is up first: not used.)
 *
 * Why a thread: the worker's main thread spends its time in SQL (claiming
 * and recording); with HTTP on the same thread, transfers stall whenever a
 * statement runs.  The HTTP thread runs only libcurl and plain C: it never
 * calls into PostgreSQL (no palloc, no elog, no latches), all signals are
 * blocked in it so PostgreSQL's handlers run on the main thread only, and it
 * is stopped and joined before the process exits.  The two threads hand
 * requests over through two mutex-protected lists: an inbox of requests to
 * start (the thread is woken with curl_multi_wakeup) and a list of finished
 * ones (the main thread waits on a condition variable with a timeout,
 * measured on CLOCK_MONOTONIC so that a step of the wall clock can neither
 * stall nor hurry the loop).
 *
 * Per-request cost matters at tens of thousands of requests a second (see
 * bench/RESULTS.md): easy handles are kept for reuse with their fixed
 * options set once, a request's header lines live in one malloc'd block,
 * and the thread is woken once per set of requests handed over.  The
 * options every request carries and its header block are in
 * http_options.c.
 */
#include "http/http.h"
#include "http/broker.h"
#include "http/rabbitmq.h"
#include "http/redis_stream.h"
#include "http/storage_queue.h"

#include <pthread.h>
#include <signal.h>
#include <time.h>

#include <curl/curl.h>

static CURLM *multi = NULL;
static CURLSH *share = NULL;		/* TLS sessions and DNS answers, for every transfer */
static pthread_t http_thread;
static bool thread_started = false;

static pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t finished_cv;	/* on CLOCK_MONOTONIC: eg_http_init() */
/* all below are protected by mutex */
static EgRequest *inbox_head = NULL;
static EgRequest *inbox_tail = NULL;
static EgRequest *finished_head = NULL;
static EgRequest *finished_tail = NULL;
static int	in_flight = 0;		/* handed to the thread, not yet taken back */
static int	finished_n = 0;		/* requests in the finished list */
static int	wait_for = 1;		/* finished requests the main thread waits for */
static bool stopping = false;
static long want_max_connections = 0;	/* applied by the thread; 0: unchanged */
static char *want_ca_file = NULL;	/* malloc'd; applied by the thread; NULL: unchanged */

/* Thread side only: the CA bundle new handles verify against ("" : the system's store). */
static char *ca_file = NULL;		/* malloc'd */
static struct curl_waitfd *wait_fds = NULL;	/* the thread's: Redis's and RabbitMQ's sockets */
static int	wait_cap = 0;

/* Thread side only: easy handles of finished transfers, ready for reuse. */
static CURL **idle_handles = NULL;
static int	idle_n = 0;
static int	idle_cap = 0;

/*
 * Only the status decides (SPEC 3): of the answer's body, the first
 * EG_RESPONSE_HEAD_BYTES are kept (for the attempt history, which shows a
 * failed answer's) and the rest is discarded as it arrives; but a token
 * request (answer_max > 0) keeps all of it, up to answer_max bytes (more
 * sets answer_len to answer_max, which token.c refuses).  The write
 * callback of every request the HTTP thread or eg_http_perform() sends.
 */
static size_t
keep_answer(char *ptr, size_t size, size_t nmemb, void *userdata)
{
	EgRequest  *req = userdata;
	size_t		n = size * nmemb;

	if (req == NULL)
		return n;
	if (req->response_head_len < EG_RESPONSE_HEAD_BYTES)
	{
		size_t		take = Min(n, (size_t) (EG_RESPONSE_HEAD_BYTES - req->response_head_len));

		memcpy(req->response_head + req->response_head_len, ptr, take);
		req->response_head_len += (int) take;
	}
	if (req->answer_max > 0 && req->answer_len < req->answer_max)
	{
		size_t		take = Min(n, req->answer_max - 1 - req->answer_len);
		char	   *grown;

		if (req->answer == NULL)
		{
			req->answer = malloc(req->answer_max);
			if (req->answer == NULL)
				return 0;		/* libcurl ends the transfer with an error */
		}
		grown = req->answer;
		memcpy(grown + req->answer_len, ptr, take);
		req->answer_len += take;
		grown[req->answer_len] = '\0';
		if (take < n)
			req->answer_len = req->answer_max;	/* too long */
	}
	return n;
}

/*
 * Frees the body and header block of a token request, which hold the
 * client's secret, clearing them first (the HTTP thread when it ends; or
 * the caller of a blocking one, token.c).
 */
void
eg_http_end_token_request(EgRequest *req)
{
	if (req->body != NULL)
		explicit_bzero(req->body, req->body_len);
	if (req->headers != NULL)
		explicit_bzero(req->headers, req->headers_size);
	eg_http_free_body(req);
}

static void
append(EgRequest **head, EgRequest **tail, EgRequest *req)
{
	req->next = NULL;
	if (*tail)
		(*tail)->next = req;
	else
		*head = req;
	*tail = req;
}

static EgTransport
classify(CURLcode rc)
{
	switch (rc)
	{
		case CURLE_OK:
			return EG_TRANSPORT_OK;
		case CURLE_OPERATION_TIMEDOUT:
			return EG_TRANSPORT_TIMEOUT;
		case CURLE_COULDNT_RESOLVE_HOST:
		case CURLE_COULDNT_RESOLVE_PROXY:
			return EG_TRANSPORT_RESOLVE;
		default:
			return EG_TRANSPORT_SOCKET;
	}
}

/*
 * Did a transfer that libcurl failed with rc end with the receiver's complete
 * answer?  An HTTP/2 server may send its whole response before it has read
 * the request body and then reset the stream with NO_ERROR (RFC 9113 section
 * 8.1; nginx does so for "return 204" whenever the body is still on its way,
 * always when it is over its 64 kB window).  libcurl 7.88 (Debian 12) then
 * fails the transfer with CURLE_HTTP2_STREAM as it goes on sending the body
 * into the closed stream, without an error message, although it had taken
 * the response as complete.  Only that case counts as the answer: a stream
 * reset with an error code, or closed before its response headers, comes
 * with libcurl's own message and stays a failure.
 */
static bool
answered_early(CURL *easy, CURLcode rc, const char *errbuf, long *status)
{
	long		version = 0;

	if (rc != CURLE_HTTP2_STREAM || errbuf[0] != '\0')
		return false;
	if (curl_easy_getinfo(easy, CURLINFO_HTTP_VERSION, &version) != CURLE_OK ||
		version != CURL_HTTP_VERSION_2_0)
		return false;
	if (curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, status) != CURLE_OK ||
		*status < 200 || *status > 599)
	{
		*status = 0;
		return false;
	}
	return true;
}

/*
 * The Retry-After of a finished transfer's answer, in seconds from now: the
 * header's delta-seconds or HTTP-date, which libcurl parses (a date in the
 * past, a value it cannot read or no header: 0).
 */
static int64
retry_after_s(CURL *easy)
{
#if LIBCURL_VERSION_NUM >= 0x074200
	curl_off_t	s = 0;

	if (curl_easy_getinfo(easy, CURLINFO_RETRY_AFTER, &s) != CURLE_OK || s < 0)
		return 0;
	return (int64) s;
#else
	return 0;
#endif
}

/* libcurl's total time of a finished transfer, in milliseconds. */
static double
total_time_ms(CURL *easy)
{
#if LIBCURL_VERSION_NUM >= 0x073d00
	curl_off_t	us = 0;

	if (curl_easy_getinfo(easy, CURLINFO_TOTAL_TIME_T, &us) != CURLE_OK)
		return 0;
	return (double) us / 1000.0;
#else
	double		s = 0;

	if (curl_easy_getinfo(easy, CURLINFO_TOTAL_TIME, &s) != CURLE_OK)
		return 0;
	return s * 1000.0;
#endif
}

/*
 * The HTTP status the attempt history records for a finished request:
 * the status line's (a Storage queue's 403 that http_status reads as
 * 401); none (0) for a request that got no HTTP answer, or whose answer
 * was a broker's (Redis, RabbitMQ: http_status is then only what Event
 * Grid's policy treats alike).  Main thread.
 */
int
eg_http_recorded_status(const EgRequest *req)
{
	if (req->transport != EG_TRANSPORT_OK || eg_is_broker_url(req->url))
		return 0;
	return req->read_as_401 ? 403 : req->http_status;
}

/*
 * Thread side: frees what libcurl owned and hands the request back (also
 * redis_stream.c's requests, which libcurl never held).
 */
void
eg_http_finish(EgRequest *req, EgTransport transport, int http_status)
{
	if (req->easy)
	{
		CURL	   *h = req->easy;

		curl_multi_remove_handle(multi, h);
		/* nothing of the request stays reachable from a handle kept for reuse */
		curl_easy_setopt(h, CURLOPT_ERRORBUFFER, NULL);
		curl_easy_setopt(h, CURLOPT_HTTPHEADER, NULL);
		curl_easy_setopt(h, CURLOPT_POSTFIELDS, NULL);
		curl_easy_setopt(h, CURLOPT_PRIVATE, NULL);
		curl_easy_setopt(h, CURLOPT_WRITEDATA, NULL);
		if (req->client_cert != NULL)
		{
			curl_easy_setopt(h, CURLOPT_SSLCERT_BLOB, NULL);
			curl_easy_setopt(h, CURLOPT_SSLKEY_BLOB, NULL);
		}
		if (idle_n < idle_cap)
			idle_handles[idle_n++] = h;
		else
			curl_easy_cleanup(h);
		req->easy = NULL;
	}
	if (req->token_request)
		eg_http_end_token_request(req);
	else if (!req->keep_body)
		eg_http_free_body(req);
	if (req->auth_line != NULL)
	{
		explicit_bzero(req->auth_line, strlen(req->auth_line));
		free(req->auth_line);
		req->auth_line = NULL;
	}
	req->transport = transport;
	req->http_status = http_status;

	pthread_mutex_lock(&mutex);
	append(&finished_head, &finished_tail, req);
	finished_n++;
	if (finished_n >= wait_for || finished_n >= in_flight)
		pthread_cond_signal(&finished_cv);
	pthread_mutex_unlock(&mutex);
}

/*
 * Thread side: a new easy handle with the options every request shares, or
 * NULL.  Only http and https, no redirects, TLS verified, no signals.
 */
static CURL *
new_handle(void)
{
	CURL	   *h = curl_easy_init();
	CURLcode	rc;

	if (h == NULL)
		return NULL;
	rc = eg_http_safe_options(h, ca_file);
#define SET(opt, val) do { if (rc == CURLE_OK) rc = curl_easy_setopt(h, (opt), (val)); } while (0)
	SET(CURLOPT_POST, 1L);
	SET(CURLOPT_SHARE, share);
	SET(CURLOPT_HTTP_VERSION, (long) CURL_HTTP_VERSION_2TLS);
	SET(CURLOPT_WRITEFUNCTION, keep_answer);
	SET(CURLOPT_TCP_NODELAY, 1L);
#undef SET
	if (rc != CURLE_OK)
	{
		curl_easy_cleanup(h);
		return NULL;
	}
	return h;
}

/*
 * What a transfer of request req needs of handle h: its URL, body, header
 * list (the bearer token first, in a node of the request's own, so that
 * the list stays one block), time limit, error buffer and answer; libcurl's
 * code of the first option it refused.
 */
static CURLcode
request_options(CURL *h, EgRequest *req)
{
	CURLcode	rc = CURLE_OK;

#define SET(opt, val) do { if (rc == CURLE_OK) rc = curl_easy_setopt(h, (opt), (val)); } while (0)
	SET(CURLOPT_URL, req->url);
	SET(CURLOPT_POSTFIELDS, req->body);
	SET(CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t) req->body_len);
	if (req->auth_line != NULL)
	{
		req->auth_node.data = req->auth_line;
		req->auth_node.next = req->headers;
		SET(CURLOPT_HTTPHEADER, &req->auth_node);
	}
	else
		SET(CURLOPT_HTTPHEADER, req->headers);
	SET(CURLOPT_TIMEOUT_MS, req->timeout_ms);
	SET(CURLOPT_ERRORBUFFER, req->errbuf);
	SET(CURLOPT_WRITEDATA, (void *) req);
#undef SET
	return rc;
}

/* Thread side: sets up and adds one transfer; a setup failure finishes it as a SocketError. */
static void
start(EgRequest *req)
{
	CURL	   *h;
	CURLcode	rc = CURLE_OK;

	if (eg_is_redis_url(req->url))
	{
		eg_redis_send(req, ca_file);	/* a RedisStream destination's: through hiredis */
		return;
	}
	if (eg_is_amqp_url(req->url))
	{
		eg_amqp_send(req, ca_file);	/* a RabbitMQ destination's: through librabbitmq */
		return;
	}
	h = idle_n > 0 ? idle_handles[--idle_n] : new_handle();
	req->easy = h;
	if (h == NULL)
	{
		snprintf(req->errbuf, sizeof(req->errbuf), "could not set up the transfer: out of memory");
		eg_http_finish(req, EG_TRANSPORT_SOCKET, 0);
		return;
	}
	rc = request_options(h, req);
	if (rc == CURLE_OK)
		rc = curl_easy_setopt(h, CURLOPT_PRIVATE, (void *) req);
	if (rc == CURLE_OK && req->client_cert != NULL)
		rc = eg_http_client_cert_options(h, req->client_cert);
	if (rc != CURLE_OK || curl_multi_add_handle(multi, h) != CURLM_OK)
	{
		snprintf(req->errbuf, sizeof(req->errbuf), "could not set up the transfer: %s",
				 rc != CURLE_OK ? curl_easy_strerror(rc) : "curl_multi_add_handle failed");
		eg_http_finish(req, EG_TRANSPORT_SOCKET, 0);
	}
}

/*
 * Sends request req at once and waits for its answer (at most timeout_ms),
 * on the caller's thread, with a handle of its own verifying against
 * ca_file: for a process that may wait (the upkeep worker's token
 * requests, token.c).  Sets req's transport, http_status, errbuf and
 * answer as a transfer of the HTTP thread would; its body and headers stay
 * the caller's.
 */
void
eg_http_perform(EgRequest *req, const char *ca_file, long timeout_ms)
{
	CURL	   *h = curl_easy_init();
	CURLcode	rc;
	long		status = 0;

	req->timeout_ms = timeout_ms;
	req->errbuf[0] = '\0';
	rc = h == NULL ? CURLE_OUT_OF_MEMORY : eg_http_safe_options(h, ca_file);
	if (rc == CURLE_OK)
		rc = curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, keep_answer);
	if (rc == CURLE_OK)
		rc = request_options(h, req);
	if (rc == CURLE_OK)
		rc = curl_easy_perform(h);
	req->transport = classify(rc);
	if (rc != CURLE_OK && req->errbuf[0] == '\0')
		snprintf(req->errbuf, sizeof(req->errbuf), "%s", curl_easy_strerror(rc));
	if (rc == CURLE_OK)
		curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
	req->http_status = (int) status;
	if (h != NULL)
		curl_easy_cleanup(h);
}

static void *
http_thread_main(void *arg)
{
	for (;;)
	{
		EgRequest  *batch;
		int			running;
		CURLMsg    *msg;
		int			left;

		long		max_connections;
		char	   *new_ca_file;

		pthread_mutex_lock(&mutex);
		if (stopping)
		{
			pthread_mutex_unlock(&mutex);
			break;
		}
		batch = inbox_head;
		inbox_head = inbox_tail = NULL;
		max_connections = want_max_connections;
		want_max_connections = 0;
		new_ca_file = want_ca_file;
		want_ca_file = NULL;
		pthread_mutex_unlock(&mutex);

		/* the multi handle belongs to this thread: only it may change it */
		if (max_connections > 0)
			curl_multi_setopt(multi, CURLMOPT_MAXCONNECTS, max_connections);
		if (new_ca_file != NULL)
		{
			/* handles kept for reuse verify against the old bundle: new ones are made */
			free(ca_file);
			ca_file = new_ca_file;
			while (idle_n > 0)
				curl_easy_cleanup(idle_handles[--idle_n]);
		}

		while (batch)
		{
			EgRequest  *next = batch->next;

			start(batch);
			batch = next;
		}

		curl_multi_perform(multi, &running);
		while ((msg = curl_multi_info_read(multi, &left)) != NULL)
		{
			EgRequest  *req;
			long		status = 0;
			EgTransport transport;

			if (msg->msg != CURLMSG_DONE)
				continue;
			curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **) &req);
			transport = classify(msg->data.result);
			if (answered_early(msg->easy_handle, msg->data.result, req->errbuf, &status))
				transport = EG_TRANSPORT_OK;
			else if (transport == EG_TRANSPORT_OK)
			{
				curl_easy_getinfo(msg->easy_handle, CURLINFO_RESPONSE_CODE, &status);
				if (status < 100 || status > 599)
				{
					transport = EG_TRANSPORT_SOCKET;	/* not a valid HTTP answer */
					snprintf(req->errbuf, sizeof(req->errbuf), "invalid HTTP status code %ld", status);
					status = 0;
				}
			}
			else if (req->errbuf[0] == '\0')
				snprintf(req->errbuf, sizeof(req->errbuf), "%s", curl_easy_strerror(msg->data.result));
			req->duration_ms = total_time_ms(msg->easy_handle);
			req->http_version = 0;
			if (transport == EG_TRANSPORT_OK)
			{
				long		version = 0;

				if (curl_easy_getinfo(msg->easy_handle, CURLINFO_HTTP_VERSION, &version) == CURLE_OK)
					req->http_version = version == CURL_HTTP_VERSION_2_0 ? 2 : version != 0 ? 1 : 0;
			}
			req->retry_after_s = transport == EG_TRANSPORT_OK ? retry_after_s(msg->easy_handle) : 0;
			req->read_as_401 = transport == EG_TRANSPORT_OK && status == 403 && req->azure_storage &&
				eg_storage_credentials_refused(msg->easy_handle);
			if (req->read_as_401)
				status = 401;	/* the key, SAS token or bearer token refused: Unauthorized */
			eg_http_finish(req, transport, (int) status);
		}
		/* sleeps until socket activity (libcurl's, Redis's or RabbitMQ's), a timeout, or curl_multi_wakeup() */
		{
			int			timeout_ms = 1000;
			int			cap = eg_redis_fd_count() + eg_amqp_fd_count();
			int			nredis;
			int			nfds;

			if (cap > wait_cap)
			{
				struct curl_waitfd *grown = realloc(wait_fds, cap * sizeof(struct curl_waitfd));

				if (grown != NULL)
				{
					wait_fds = grown;
					wait_cap = cap;
				}
			}
			if (wait_cap < cap)
			{
				/* out of memory: no extra sockets (the deadlines still count), a short wait instead */
				cap = 0;
				timeout_ms = 10;
			}
			nredis = eg_redis_wait_fds(wait_fds, 0, cap, &timeout_ms);
			nfds = eg_amqp_wait_fds(wait_fds, nredis, cap, &timeout_ms);
			curl_multi_poll(multi, nfds > 0 ? wait_fds : NULL, nfds, timeout_ms, NULL);
			eg_redis_after_wait(wait_fds, nredis);
			eg_amqp_after_wait(nfds > nredis ? wait_fds + nredis : NULL, nfds - nredis);
		}
	}
	return NULL;
}

/* Starts libcurl and the HTTP thread; call once in the worker. */
void
eg_http_init(void)
{
	sigset_t	all,
				old;
	int			rc;
	pthread_condattr_t attr;

	if (curl_global_init(CURL_GLOBAL_ALL) != CURLE_OK)
		elog(ERROR, "eventgrid: curl_global_init failed");
	multi = curl_multi_init();
	if (multi == NULL)
		elog(ERROR, "eventgrid: curl_multi_init failed");
	curl_multi_setopt(multi, CURLMOPT_MAXCONNECTS, (long) Max(eg_max_concurrent_requests, 8));
	curl_multi_setopt(multi, CURLMOPT_PIPELINING, (long) CURLPIPE_MULTIPLEX);
	share = curl_share_init();
	if (share == NULL ||
		curl_share_setopt(share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION) != CURLSHE_OK ||
		curl_share_setopt(share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS) != CURLSHE_OK)
		elog(ERROR, "eventgrid: curl_share_init failed");
	ca_file = strdup(eg_ssl_ca_file ? eg_ssl_ca_file : "");
	if (ca_file == NULL)
		elog(ERROR, "eventgrid: out of memory");
	want_max_connections = 0;
	/* room for the handles of the most requests that may ever be in flight */
	idle_cap = EG_MAX_CONCURRENT_REQUESTS_LIMIT;
	idle_handles = calloc(idle_cap, sizeof(CURL *));
	if (idle_handles == NULL)
		elog(ERROR, "eventgrid: out of memory for the HTTP handle pool");
	idle_n = 0;
	stopping = false;

	/* timed waits are deadlines on CLOCK_MONOTONIC (eg_http_wait) */
	if (pthread_condattr_init(&attr) != 0 ||
		pthread_condattr_setclock(&attr, CLOCK_MONOTONIC) != 0 ||
		pthread_cond_init(&finished_cv, &attr) != 0)
		elog(ERROR, "eventgrid: could not set up the HTTP thread's condition variable");
	pthread_condattr_destroy(&attr);

	/* the thread inherits the signal mask: block everything for it */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	rc = pthread_create(&http_thread, NULL, http_thread_main, NULL);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc != 0)
		elog(ERROR, "eventgrid: could not start the HTTP thread: %s", strerror(rc));
	thread_started = true;
}

/* Stops and joins the HTTP thread, then frees libcurl; safe to call twice. */
void
eg_http_shutdown(void)
{
	if (thread_started)
	{
		pthread_mutex_lock(&mutex);
		stopping = true;
		pthread_mutex_unlock(&mutex);
		curl_multi_wakeup(multi);
		pthread_join(http_thread, NULL);
		thread_started = false;
		eg_redis_close_all();
		eg_amqp_close_all();
	}
	while (idle_n > 0)
		curl_easy_cleanup(idle_handles[--idle_n]);
	free(idle_handles);
	idle_handles = NULL;
	idle_cap = 0;
	if (multi)
		curl_multi_cleanup(multi);
	multi = NULL;
	/* after every easy handle that used it */
	if (share)
		curl_share_cleanup(share);
	share = NULL;
	free(wait_fds);
	wait_fds = NULL;
	wait_cap = 0;
	free(ca_file);
	ca_file = NULL;
	free(want_ca_file);
	want_ca_file = NULL;
}

/*
 * Sets the size of libcurl's connection cache (kept-alive connections) to
 * follow eventgrid.max_concurrent_requests after a reload; at least 8.
 */
void
eg_http_set_max_connections(long n)
{
	pthread_mutex_lock(&mutex);
	want_max_connections = Max(n, 8);
	pthread_mutex_unlock(&mutex);
	if (multi)
		curl_multi_wakeup(multi);
}

/*
 * Makes new transfers verify certificates against the PEM bundle path
 * ("": the system's CA store) after eventgrid.ssl_ca_file changed.
 */
void
eg_http_set_ca_file(const char *path)
{
	static char *requested = NULL;	/* main thread: the last path asked for */
	char	   *copy;

	path = path ? path : "";
	if (requested != NULL && strcmp(requested, path) == 0)
		return;
	free(requested);
	requested = strdup(path);
	copy = strdup(path);
	if (copy == NULL || requested == NULL)
		ereport(ERROR, (errcode(ERRCODE_OUT_OF_MEMORY), errmsg("eventgrid: out of memory")));
	pthread_mutex_lock(&mutex);
	free(want_ca_file);
	want_ca_file = copy;
	pthread_mutex_unlock(&mutex);
	if (multi)
		curl_multi_wakeup(multi);
}

/*
 * Hands POSTs of reqs[0..n) to the HTTP thread, each of req->body to
 * req->url with a total time limit of timeout_ms, and wakes the thread once.
 * From here until eg_http_take_finished() returns it, a request (with its
 * malloc'd body and header block, which the thread frees) belongs to the
 * thread; its url must stay valid until then.
 */
void
eg_http_start(EgRequest **reqs, int n, long timeout_ms)
{
	if (n <= 0)
		return;
	for (int i = 0; i < n; i++)
	{
		EgRequest  *req = reqs[i];

		req->timeout_ms = timeout_ms;
		req->errbuf[0] = '\0';
		req->duration_ms = 0;
		req->response_head_len = 0;	/* a request sent again (after a 401) starts afresh */
		if (req->headers == NULL)
			eg_http_set_headers(req, "", 0, 0);
	}
	pthread_mutex_lock(&mutex);
	for (int i = 0; i < n; i++)
		append(&inbox_head, &inbox_tail, reqs[i]);
	in_flight += n;
	pthread_mutex_unlock(&mutex);
	curl_multi_wakeup(multi);
}

int
eg_http_in_flight(void)
{
	int			n;

	pthread_mutex_lock(&mutex);
	n = in_flight;
	pthread_mutex_unlock(&mutex);
	return n;
}

/*
 * Waits at most timeout_ms until at least want requests have finished, or
 * all in flight have (returns at once if that is so already).  Waiting for
 * several lets the caller hand back and start requests in sets, one
 * in-flight record per set, while the rest are still on the wire.
 */
void
eg_http_wait(int want, int timeout_ms)
{
	struct timespec deadline;

	clock_gettime(CLOCK_MONOTONIC, &deadline);
	deadline.tv_nsec += (long) timeout_ms * 1000000L;
	deadline.tv_sec += deadline.tv_nsec / 1000000000L;
	deadline.tv_nsec %= 1000000000L;

	pthread_mutex_lock(&mutex);
	wait_for = Max(want, 1);
	while (finished_n < wait_for && finished_n < in_flight)
	{
		if (pthread_cond_timedwait(&finished_cv, &mutex, &deadline) != 0)
			break;				/* timed out */
	}
	wait_for = 1;
	pthread_mutex_unlock(&mutex);
}

/* Pops one finished request, or NULL. */
EgRequest *
eg_http_take_finished(void)
{
	EgRequest  *req;

	pthread_mutex_lock(&mutex);
	req = finished_head;
	if (req)
	{
		finished_head = req->next;
		if (finished_head == NULL)
			finished_tail = NULL;
		req->next = NULL;
		in_flight--;
		finished_n--;
	}
	pthread_mutex_unlock(&mutex);
	return req;
}
