/*
 * http_options.c - what every request eventgrid sends carries, whichever
 * thread sends it: the safe libcurl options, a client certificate, and the
 * one malloc'd block of its header lines (http.h).
 */
#include "http/http.h"

#include <curl/curl.h>

/*
 * What every request eventgrid sends has (deliveries, validation
 * handshakes): http and https only, no redirects, certificates always
 * verified (against ca_file when not empty), no signals, eventgrid's
 * User-Agent.  Returns libcurl's code of the first option it refused.
 */
CURLcode
eg_http_safe_options(CURL *h, const char *ca_file)
{
	CURLcode	rc = CURLE_OK;

#define SET(opt, val) do { if (rc == CURLE_OK) rc = curl_easy_setopt(h, (opt), (val)); } while (0)
	SET(CURLOPT_NOSIGNAL, 1L);
	SET(CURLOPT_FOLLOWLOCATION, 0L);
#if LIBCURL_VERSION_NUM >= 0x075500
	SET(CURLOPT_PROTOCOLS_STR, "http,https");
#else
	SET(CURLOPT_PROTOCOLS, (long) (CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
	SET(CURLOPT_SSL_VERIFYPEER, 1L);
	SET(CURLOPT_SSL_VERIFYHOST, 2L);
	if (ca_file != NULL && ca_file[0] != '\0')
		SET(CURLOPT_CAINFO, ca_file);
	SET(CURLOPT_USERAGENT, "eventgrid-postgresql/" EG_VERSION);
#undef SET
	return rc;
}

/*
 * Makes handle h present client certificate c (mutual TLS): PEM blobs,
 * copied by libcurl, which then reuses a TLS session or connection only for
 * the same certificate.  Returns libcurl's code of the first option it
 * refused.  Deliveries (start()) and validation handshakes
 * (validation.c) alike.
 */
CURLcode
eg_http_client_cert_options(CURL *h, const EgClientCert *c)
{
	struct curl_blob cert = {c->cert, c->cert_len, CURL_BLOB_COPY};
	struct curl_blob key = {c->key, c->key_len, CURL_BLOB_COPY};
	CURLcode	rc = CURLE_OK;

#define SET(opt, val) do { if (rc == CURLE_OK) rc = curl_easy_setopt(h, (opt), (val)); } while (0)
	SET(CURLOPT_SSLCERT_BLOB, &cert);
	SET(CURLOPT_SSLCERTTYPE, "PEM");
	SET(CURLOPT_SSLKEY_BLOB, &key);
	SET(CURLOPT_SSLKEYTYPE, "PEM");
	/*
	 * never no password: libcurl's OpenSSL password callback reads it
	 * unchecked, and a key that 0.14.0 accepted with an empty passphrase
	 * would crash the worker (set_client_certificate() now refuses any
	 * encrypted key)
	 */
	SET(CURLOPT_KEYPASSWD, "");
#undef SET
	return rc;
}

/*
 * Gives a request not yet started its header lines: n NUL-terminated
 * "Name: value" lines one after another in lines[0..len), which are copied.
 * The list libcurl reads (public struct curl_slist nodes) and the text are
 * one malloc'd block, freed by eg_http_free_headers(); an "Expect:" line is
 * added so that libcurl never waits for "100 Continue".
 */
void
eg_http_set_headers(EgRequest *req, const char *lines, size_t len, int n)
{
	static const char expect[] = "Expect:";
	size_t		nodes = (size_t) (n + 1) * sizeof(struct curl_slist);
	char	   *block = malloc(nodes + len + sizeof(expect));
	struct curl_slist *list = (struct curl_slist *) block;
	char	   *text = block + nodes;

	if (block == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("eventgrid: out of memory building request headers")));
	eg_http_free_headers(req);
	memcpy(text, lines, len);
	memcpy(text + len, expect, sizeof(expect));
	for (int i = 0; i <= n; i++)
	{
		list[i].data = text;
		list[i].next = i < n ? &list[i + 1] : NULL;
		text += strlen(text) + 1;
	}
	req->headers = list;
	req->headers_size = nodes + len + sizeof(expect);
}

/* Frees the header list of a request (the HTTP thread does so when one ends). */
void
eg_http_free_headers(EgRequest *req)
{
	free(req->headers);
	req->headers = NULL;
	req->headers_size = 0;
}

/*
 * Frees the malloc'd body and header block of a request that will not be
 * sent (again): one not started, or one whose body was kept (keep_body).
 */
void
eg_http_free_body(EgRequest *req)
{
	eg_http_free_headers(req);
	free(req->body);
	req->body = NULL;
	/* a request that ends unsent (a Redis request's AUTH: redis_stream.c) */
	if (req->auth_line != NULL)
	{
		explicit_bzero(req->auth_line, strlen(req->auth_line));
		free(req->auth_line);
		req->auth_line = NULL;
	}
}
