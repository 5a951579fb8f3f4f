/*
 * http.c - delivery requests through libcurl's multi interface: many POSTs
 * in flight on one thread, connections kept alive and reused, only http and
 * https, no redirects, response bodies discarded as they arrive, TLS
 * verified, a total time limit per request (SPEC section 3's 30 s).
 */
#include "eventgrid.h"

#include <curl/curl.h>

static CURLM *multi = NULL;
static int	in_flight = 0;
static EgRequest *finished_head = NULL;
static EgRequest *finished_tail = NULL;

/* Response bodies are not kept: only the status matters (SPEC 3). */
static size_t
discard_body(char *ptr, size_t size, size_t nmemb, void *userdata)
{
	return size * nmemb;
}

#define EG_SETOPT(h, opt, val) \
	do { \
		CURLcode rc_ = curl_easy_setopt((h), (opt), (val)); \
		if (rc_ != CURLE_OK) \
			elog(ERROR, "eventgrid: curl_easy_setopt(%s) failed: %s", #opt, curl_easy_strerror(rc_)); \
	} while (0)

/* Starts libcurl; call once in the worker before any request. */
void
eg_http_init(void)
{
	if (curl_global_init(CURL_GLOBAL_ALL) != CURLE_OK)
		elog(ERROR, "eventgrid: curl_global_init failed");
	multi = curl_multi_init();
	if (multi == NULL)
		elog(ERROR, "eventgrid: curl_multi_init failed");
	curl_multi_setopt(multi, CURLMOPT_MAXCONNECTS, (long) Max(eg_max_concurrent_requests, 8));
}

void
eg_http_shutdown(void)
{
	if (multi)
		curl_multi_cleanup(multi);
	multi = NULL;
}

/* Adds "Name: value" to a request not yet started. */
void
eg_http_add_header(EgRequest *req, const char *line)
{
	struct curl_slist *l = curl_slist_append(req->headers, line);

	if (l == NULL)
		elog(ERROR, "eventgrid: out of memory building request headers");
	req->headers = l;
}

/*
 * Starts a POST of req->body to url.  The request owns req->body (malloc'd)
 * and req->headers until eg_http_take_finished() returns it.
 */
void
eg_http_start(EgRequest *req, const char *url, long timeout_ms)
{
	CURL	   *h = curl_easy_init();
	CURLMcode	mrc;

	if (h == NULL)
		elog(ERROR, "eventgrid: curl_easy_init failed");
	req->easy = h;
	req->errbuf[0] = '\0';
	eg_http_add_header(req, "Expect:");

	EG_SETOPT(h, CURLOPT_URL, url);
	EG_SETOPT(h, CURLOPT_POST, 1L);
	EG_SETOPT(h, CURLOPT_POSTFIELDS, req->body);
	EG_SETOPT(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t) req->body_len);
	EG_SETOPT(h, CURLOPT_HTTPHEADER, req->headers);
	EG_SETOPT(h, CURLOPT_TIMEOUT_MS, timeout_ms);
	EG_SETOPT(h, CURLOPT_NOSIGNAL, 1L);
	EG_SETOPT(h, CURLOPT_FOLLOWLOCATION, 0L);
#if LIBCURL_VERSION_NUM >= 0x075500
	EG_SETOPT(h, CURLOPT_PROTOCOLS_STR, "http,https");
#else
	EG_SETOPT(h, CURLOPT_PROTOCOLS, (long) (CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
	EG_SETOPT(h, CURLOPT_SSL_VERIFYPEER, 1L);
	EG_SETOPT(h, CURLOPT_SSL_VERIFYHOST, 2L);
	EG_SETOPT(h, CURLOPT_WRITEFUNCTION, discard_body);
	EG_SETOPT(h, CURLOPT_USERAGENT, "eventgrid-postgresql/0.1");
	EG_SETOPT(h, CURLOPT_ERRORBUFFER, req->errbuf);
	EG_SETOPT(h, CURLOPT_PRIVATE, (void *) req);
	EG_SETOPT(h, CURLOPT_TCP_NODELAY, 1L);

	mrc = curl_multi_add_handle(multi, h);
	if (mrc != CURLM_OK)
		elog(ERROR, "eventgrid: curl_multi_add_handle failed: %s", curl_multi_strerror(mrc));
	in_flight++;
}

int
eg_http_in_flight(void)
{
	return in_flight;
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
 * Drives transfers, waiting at most timeout_ms for socket activity, and
 * moves completed requests to the finished list.
 */
void
eg_http_wait(int timeout_ms)
{
	int			running;
	CURLMsg    *msg;
	int			left;
	CURLMcode	mrc;

	mrc = curl_multi_perform(multi, &running);
	if (mrc != CURLM_OK)
		elog(ERROR, "eventgrid: curl_multi_perform failed: %s", curl_multi_strerror(mrc));
	if (running > 0 && timeout_ms > 0)
	{
		mrc = curl_multi_poll(multi, NULL, 0, timeout_ms, NULL);
		if (mrc != CURLM_OK)
			elog(ERROR, "eventgrid: curl_multi_poll failed: %s", curl_multi_strerror(mrc));
		mrc = curl_multi_perform(multi, &running);
		if (mrc != CURLM_OK)
			elog(ERROR, "eventgrid: curl_multi_perform failed: %s", curl_multi_strerror(mrc));
	}

	while ((msg = curl_multi_info_read(multi, &left)) != NULL)
	{
		EgRequest  *req;
		long		status = 0;

		if (msg->msg != CURLMSG_DONE)
			continue;
		curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **) &req);
		req->transport = classify(msg->data.result);
		if (req->transport == EG_TRANSPORT_OK)
		{
			curl_easy_getinfo(msg->easy_handle, CURLINFO_RESPONSE_CODE, &status);
			if (status < 100 || status > 599)
				req->transport = EG_TRANSPORT_SOCKET;	/* not a valid HTTP answer */
		}
		req->http_status = (int) status;
		curl_multi_remove_handle(multi, msg->easy_handle);
		curl_easy_cleanup(msg->easy_handle);
		req->easy = NULL;
		curl_slist_free_all(req->headers);
		req->headers = NULL;
		free(req->body);
		req->body = NULL;
		in_flight--;

		req->next = NULL;
		if (finished_tail)
			finished_tail->next = req;
		else
			finished_head = req;
		finished_tail = req;
	}
}

/* Pops one finished request, or NULL. */
EgRequest *
eg_http_take_finished(void)
{
	EgRequest  *req = finished_head;

	if (req)
	{
		finished_head = req->next;
		if (finished_head == NULL)
			finished_tail = NULL;
		req->next = NULL;
	}
	return req;
}
