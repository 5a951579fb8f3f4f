/*
 * broker.c - what the HTTP thread's broker destinations share (broker.h):
 * Redis streams (redis_connections.c) and RabbitMQ (rabbitmq_connections.c).
 * Nothing here calls into PostgreSQL.
 */
#include "http/broker.h"

#include <time.h>

double
eg_mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec * 1000.0 + (double) ts.tv_nsec / 1e6;
}

void
eg_broker_end(EgRequest *req, EgTransport transport, int status, const char *text)
{
	req->duration_ms = eg_mono_ms() - req->duration_ms;
	if (text != NULL)
	{
		if (transport == EG_TRANSPORT_OK)
		{
			req->response_head_len = (int) Min(strlen(text), (size_t) EG_RESPONSE_HEAD_BYTES);
			memcpy(req->response_head, text, req->response_head_len);
		}
		else
			snprintf(req->errbuf, sizeof(req->errbuf), "%s", text);
	}
	req->next = NULL;
	eg_http_finish(req, transport, status);
}

void
eg_request_push(EgRequest **head, EgRequest **tail, EgRequest *req)
{
	req->next = NULL;
	if (*tail)
		(*tail)->next = req;
	else
		*head = req;
	*tail = req;
}

EgRequest *
eg_request_pop(EgRequest **head, EgRequest **tail)
{
	EgRequest  *req = *head;

	if (req)
	{
		*head = req->next;
		if (*head == NULL)
			*tail = NULL;
		req->next = NULL;
	}
	return req;
}

void *
eg_broker_conn_for(EgBrokerTable *t, size_t size, const char *url, size_t url_len, const char *login)
{
	size_t		login_len = login ? strlen(login) : 0;
	size_t		key_len = url_len + 1 + login_len;
	EgBrokerKey *c;

	for (int i = 0; i < t->n; i++)
	{
		c = t->conns[i];
		if (c->len == key_len && memcmp(c->key, url, url_len) == 0 && c->key[url_len] == '\n' &&
			(login_len == 0 || memcmp(c->key + url_len + 1, login, login_len) == 0))
			return c;
	}
	if (t->n == t->cap)
	{
		int			cap = Max(t->cap * 2, 8);
		EgBrokerKey **grown = realloc(t->conns, cap * sizeof(EgBrokerKey *));

		if (grown == NULL)
			return NULL;
		t->conns = grown;
		t->cap = cap;
	}
	c = calloc(1, size);
	if (c == NULL || (c->key = malloc(key_len + 1)) == NULL)
	{
		free(c);
		return NULL;
	}
	memcpy(c->key, url, url_len);
	c->key[url_len] = '\n';
	if (login_len > 0)
		memcpy(c->key + url_len + 1, login, login_len);
	c->key[key_len] = '\0';
	c->len = key_len;
	t->conns[t->n++] = c;
	return c;
}

void
eg_broker_conn_forget(EgBrokerTable *t, int i)
{
	EgBrokerKey *c = t->conns[i];

	explicit_bzero(c->key, c->len);
	free(c->key);
	free(c);
	t->conns[i] = t->conns[--t->n];
}
