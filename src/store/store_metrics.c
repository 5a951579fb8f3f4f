/*
 * store_metrics.c - the counters behind the Prometheus metrics that the
 * record of outcomes keeps (README "Monitoring"): failed delivery attempts
 * by outcome, dead-lettered and dropped events by reason, and two
 * histograms, the destination's processing duration per request and the
 * latency from publish to a successful delivery per event.  Written in the
 * record's own transaction (eg_store_record), so that they move exactly
 * when the outcomes they count are recorded, and kept in
 * eventgrid.subscription_metric_counts, one row per event subscription,
 * metric and label (an outcome, a reason or a bucket's upper bound),
 * summed here first so that a record of hundreds of deliveries writes a
 * few rows per subscription.
 */
#include "store/store.h"
#include "store/store_sql.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"

/*
 * Upper bounds of the histograms' buckets, in seconds.  The SQL views add
 * each count to every bucket whose bound is at least the bound it was
 * counted under (eventgrid._histogram_buckets lists the same bounds), and
 * an observation above the last bound goes to +Inf.
 */
static const double processing_bounds[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
static const double latency_bounds[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
	300, 900, 3600, 21600, 86400};

/* each histogram's _SUM right after its _BUCKET: observe() counts on it */
typedef enum MetricKind
{
	M_FAIL,						/* label: the attempt's outcome */
	M_FINAL,					/* label: the reason; dead_lettered or dropped by the subscription */
	M_PROCESSING_BUCKET,
	M_PROCESSING_SUM,
	M_LATENCY_BUCKET,
	M_LATENCY_SUM,
	M_KINDS
} MetricKind;

static const char *const kind_names[M_KINDS] = {
	"attempt_fail", "final", "processing_bucket", "processing_sum", "latency_bucket", "latency_sum"
};

/* One increment: subscription, kind, label index (outcome, reason or bucket), amount. */
typedef struct MetricDelta
{
	int64		subscription_id;
	int			kind;
	int			label;
	double		value;
} MetricDelta;

static int
cmp_deltas(const void *a, const void *b)
{
	const MetricDelta *x = a;
	const MetricDelta *y = b;

	if (x->subscription_id != y->subscription_id)
		return x->subscription_id < y->subscription_id ? -1 : 1;
	if (x->kind != y->kind)
		return x->kind - y->kind;
	return x->label - y->label;
}

/* The bucket of seconds among bounds[0..n): its index, or n for +Inf. */
static int
bucket_of(double seconds, const double *bounds, int n)
{
	int			i = 0;

	while (i < n && seconds > bounds[i])
		i++;
	return i;
}

static const char *
bucket_label(int i, const double *bounds, int n)
{
	return i < n ? psprintf("%g", bounds[i]) : "+Inf";
}

static const char *
label_of(const MetricDelta *d)
{
	switch ((MetricKind) d->kind)
	{
		case M_FAIL:
			return eg_outcome_name((EgOutcomeCode) d->label);
		case M_FINAL:
			return eg_reason_name((EgFinalReason) d->label);
		case M_PROCESSING_BUCKET:
			return bucket_label(d->label, processing_bounds, lengthof(processing_bounds));
		case M_LATENCY_BUCKET:
			return bucket_label(d->label, latency_bounds, lengthof(latency_bounds));
		default:
			return "";
	}
}

/*
 * Adds each increment to its row, or makes the row; a final count becomes
 * dead_lettered or dropped as the subscription says now (the record's
 * counters read deadletter the same way), and a subscription dropped
 * meanwhile counts nothing.  Rows come sorted and the subscriptions'
 * counter rows are locked first (eg_store_record), so two workers cannot
 * deadlock here.
 */
static EgStatement add_metrics = {
	.name = "metric counts",
	.sql =
	"INSERT INTO eventgrid.subscription_metric_counts AS c (subscription_id, metric, label, value)"
	"SELECT m.subscription_id,"
	"       CASE WHEN m.metric <> 'final' THEN m.metric WHEN s.deadletter THEN 'dead_lettered' ELSE 'dropped' END,"
	"       m.label, m.value"
	"  FROM unnest($1::int8[], $2::text[], $3::text[], $4::float8[]) WITH ORDINALITY AS m(subscription_id, metric, label, value, o)"
	" CROSS JOIN LATERAL (SELECT s.deadletter FROM eventgrid.event_subscriptions s"
	"                      WHERE s.id = m.subscription_id OFFSET 0) s"
	" ORDER BY m.o "
	"ON CONFLICT (subscription_id, metric, label) DO UPDATE SET value = c.value + excluded.value",
	.nargs = 4,
	.types = {INT8ARRAYOID, TEXTARRAYOID, TEXTARRAYOID, FLOAT8ARRAYOID},
	.generic = true,
};

/*
 * Adds at d[k] one observation of seconds to a histogram (its bucket, the
 * next kind its sum) of subscription sub; returns the next free place.
 */
static int
observe(MetricDelta *d, int k, int64 sub, int bucket_kind, double seconds, const double *bounds, int nbounds)
{
	d[k].subscription_id = sub;
	d[k].kind = bucket_kind;
	d[k].label = bucket_of(seconds, bounds, nbounds);
	d[k++].value = 1;
	d[k].subscription_id = sub;
	d[k].kind = bucket_kind + 1;	/* its _SUM */
	d[k].label = 0;
	d[k++].value = seconds;
	return k;
}

/*
 * Counts the metrics of outcomes[0..n), as eg_store_record records them:
 * each attempt made that did not deliver (by outcome), each delivery ended
 * undelivered (by reason), each request answered (its duration, once per
 * request) and each delivery made (publish to answer).
 */
void
eg_store_record_metrics(EgOutcome *const *outcomes, int n)
{
	/* at most four per outcome: a failure (1), its end (1) and its request (2), or a delivery (2 + 2) */
	MetricDelta *d = palloc(Max(n, 1) * 4 * sizeof(MetricDelta));
	int			k = 0;
	int			m = 0;

	for (int i = 0; i < n; i++)
	{
		const EgOutcome *o = outcomes[i];
		MetricDelta base = {.subscription_id = o->subscription_id, .value = 1};

		if (o->action != EG_ACTION_DELIVERED && o->attempted)
		{
			d[k] = base;
			d[k].kind = M_FAIL;
			d[k++].label = (int) o->outcome;
		}
		if (o->action == EG_ACTION_FINAL)
		{
			d[k] = base;
			d[k].kind = M_FINAL;
			d[k++].label = (int) o->reason;
		}
		if (o->attempted && o->request_head && o->duration_ms >= 0)
			k = observe(d, k, o->subscription_id, M_PROCESSING_BUCKET, o->duration_ms / 1000.0,
						processing_bounds, lengthof(processing_bounds));
		if (o->action == EG_ACTION_DELIVERED && o->publish_time != 0)
			k = observe(d, k, o->subscription_id, M_LATENCY_BUCKET,
						/* a clock stepped back counts as 0 */
						Max((double) (o->attempted_at - o->publish_time) / USECS_PER_SEC
							+ Max(o->duration_ms, 0) / 1000.0, 0),
						latency_bounds, lengthof(latency_bounds));
	}
	if (k == 0)
		return;
	qsort(d, k, sizeof(MetricDelta), cmp_deltas);
	for (int i = 0; i < k; i++)
	{
		if (m > 0 && cmp_deltas(&d[m - 1], &d[i]) == 0)
			d[m - 1].value += d[i].value;
		else
			d[m++] = d[i];
	}
	{
		Datum	   *subs = palloc(m * sizeof(Datum));
		Datum	   *kinds = palloc(m * sizeof(Datum));
		Datum	   *labels = palloc(m * sizeof(Datum));
		Datum	   *values = palloc(m * sizeof(Datum));
		Datum		args[4];

		for (int i = 0; i < m; i++)
		{
			const char *label = label_of(&d[i]);

			subs[i] = Int64GetDatum(d[i].subscription_id);
			kinds[i] = CStringGetTextDatum(kind_names[d[i].kind]);
			labels[i] = CStringGetTextDatum(label ? label : "");
			values[i] = Float8GetDatum(d[i].value);
		}
		args[0] = eg_make_array(subs, NULL, m, INT8OID);
		args[1] = eg_make_array(kinds, NULL, m, TEXTOID);
		args[2] = eg_make_array(labels, NULL, m, TEXTOID);
		args[3] = eg_make_array(values, NULL, m, FLOAT8OID);
		eg_store_run(&add_metrics, args, SPI_OK_INSERT);
	}
}
