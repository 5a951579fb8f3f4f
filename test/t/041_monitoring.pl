# Monitoring (README "Monitoring", monitoring/): Debian's
# prometheus-postgres-exporter started with monitoring/postgres_exporter.yml
# as monitoring/README.md says, connected as a role that has only
# pg_monitor, and a real Prometheus scraping it with
# monitoring/prometheus-alerts.yml loaded.  Deliveries that succeed, fail
# with several outcomes, are dead-lettered, dropped and wait in a backlog;
# then every metric Prometheus holds equals what eventgrid's SQL views say,
# the histograms count every delivery and every answered request, the
# dead-letter alert fires, every query of monitoring/grafana-dashboard.json
# returns a series, and promtool checks and unit-tests the alert rules.
# Dead-letter notifications: a dead-lettered and a dropped event are each
# published to the subscription's dead_letter_topic, delivered to a
# receiver and parsed by the Azure SDK; a notification that is itself
# dead-lettered notifies no one.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use File::Basename qw(dirname);
use File::Spec;
use HTTP::Tiny;
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $monitoring = File::Spec->rel2abs("$FindBin::RealBin/../../monitoring");
my $json = JSON::PP->new;
my $http_port = PostgreSQL::Test::Cluster::get_free_port();
my $node = new_node('monitoring', 'eventgrid.response_timeout' => "'1s'", 'eventgrid.http_port' => $http_port);
my $r = start_receiver();
my $u = $r->{url};
sub sql { return $node->safe_psql('postgres', shift) }

# the exporter's role: pg_monitor and nothing else
sql("CREATE ROLE exporter LOGIN IN ROLE pg_monitor");
sql("CREATE ROLE nobody LOGIN");
for my $view (qw(topic_metrics event_subscription_metrics event_subscription_metric_labels
	event_subscription_histograms worker_metrics client_certificate_metrics delivery_token_metrics ordering_metrics
	queue_metrics event_subscription_expiration_metrics))
{
	my ($ok) = $node->psql('postgres', "SELECT count(*) FROM eventgrid.$view", extra_params => [ '-U', 'exporter' ]);
	is($ok, 0, "pg_monitor reads eventgrid.$view");
	my ($rc, $out, $err) = $node->psql('postgres', "SELECT count(*) FROM eventgrid.$view", extra_params => [ '-U', 'nobody' ]);
	like($err, qr/permission denied/, "a role without pg_monitor does not read eventgrid.$view");
}
my (undef, undef, $secret_err) = $node->psql('postgres', "SELECT * FROM eventgrid.signing_secrets",
	extra_params => [ '-U', 'exporter' ]);
like($secret_err, qr/permission denied/, 'the exporter role does not read signing secrets');
(undef, undef, $secret_err) = $node->psql('postgres', "SELECT * FROM eventgrid.client_certificates",
	extra_params => [ '-U', 'exporter' ]);
like($secret_err, qr/permission denied/, 'nor client certificates and their keys');

sql("SELECT eventgrid.create_topic('shop')");
sql("SELECT eventgrid.create_topic('alerts')");
sql("SELECT eventgrid.create_topic('alerts-ce', 'CloudEventSchemaV1_0')");
sql("SELECT eventgrid.create_event_subscription('shop', 'fulfilment', '$u/status/200/fulfilment?delay_ms=20')");
sql("SELECT eventgrid.create_event_subscription('shop', 'batched', '$u/status/200/batched', max_events_per_batch => 4, "
	  . "expiration_time => date_trunc('second', now()) + interval '30 days')");
sql("SELECT eventgrid.create_event_subscription('shop', 'refusing', '$u/status/400/refusing', deadletter => true,
	dead_letter_topic => 'alerts')");
sql("SELECT eventgrid.create_event_subscription('shop', 'overloaded', '$u/status/503/overloaded',
	max_delivery_attempts => 1, dead_letter_topic => 'alerts-ce')");
sql("SELECT eventgrid.create_event_subscription('shop', 'hanging', '$u/hang/hanging', max_delivery_attempts => 1,
	deadletter => true)");
sql("SELECT eventgrid.create_event_subscription('shop', 'held', '$u/status/200/held')");
sql("SELECT eventgrid.pause_delivery('shop', 'held')");
sql("SELECT eventgrid.create_event_subscription('alerts', 'pager', '$u/status/200/pager')");
sql("SELECT eventgrid.create_event_subscription('alerts-ce', 'pager-ce', '$u/status/200/pager-ce')");
# a queue subscription (pull delivery)
sql("SELECT eventgrid.create_topic('jobs', 'CloudEventSchemaV1_0', 'namespace')");

# over HTTP: two publishes to inbound (a topic no one subscribes to) and one with a wrong key (PublishFailCount), counted by the listener
# a WAL source (messages only) streaming from a plain cluster: the dashboard's WAL source panels
my ($app, $app_conn) = source_cluster('app', 'CREATE PUBLICATION app_pub');
sql("SELECT eventgrid.create_wal_source('app', '$app_conn', 'app_pub')");
sql("SELECT eventgrid.create_topic('inbound')");
my $inbound_key = sql("SELECT key1 FROM eventgrid.topic_keys WHERE topic = 'inbound'");
my $http = HTTP::Tiny->new(timeout => 10);
my $one = $json->encode([ { id => 'h1', subject => 's', eventType => 'Shop.Http', eventTime => '2026-01-01T00:00:00Z',
	data => {}, dataVersion => '1' } ]);
# (the listener may still be starting: a refused connection, 599, is tried again)
sub post_inbound
{
	my ($key) = @_;
	my $status = 599;
	for (1 .. 50)
	{
		$status = $http->post("http://127.0.0.1:$http_port/postgres/topics/inbound/api/events",
			{ headers => { 'aeg-sas-key' => $key, 'Content-Type' => 'application/json' }, content => $one })->{status};
		last if $status != 599;
		usleep(200_000);
	}
	return $status;
}
my @statuses = map { post_inbound($_) } ($inbound_key, $inbound_key, 'wrong');
is("@statuses", '200 200 401', 'two publishes over HTTP and one refused');

sql("SELECT eventgrid.create_event_subscription('jobs', 'workers', delivery_mode => 'queue')");
# a subscription of the notification topic that dead-letters into it: no loop
sql("SELECT eventgrid.create_event_subscription('alerts', 'looping', '$u/status/400/looping', deadletter => true,
	dead_letter_topic => 'alerts')");

# the exporter and Prometheus, with the commands monitoring/README.md gives
my $dir = $PostgreSQL::Test::Utils::tmp_check . '/monitoring';
mkdir $dir;

# a client certificate (the receiver is plain HTTP: only its expiry is looked at)
make_ca($dir, 'ca', 30);
issue_certificate($dir, 'ca', 'fulfilment', undef, '-days', '20');
sql("SELECT eventgrid.set_client_certificate('shop', 'fulfilment', \$pem\$" . slurp_file("$dir/fulfilment.pem")
	  . "\$pem\$, \$pem\$" . slurp_file("$dir/fulfilment.key") . "\$pem\$)");
my ($exporter_port, $prom_port) = map { PostgreSQL::Test::Cluster::get_free_port() } 1 .. 2;
my $dsn = sprintf('host=%s port=%d user=exporter dbname=postgres sslmode=disable', $node->host, $node->port);
my ($eout, $eerr, $pout, $perr) = ('', '', '', '');
# the exporter as monitoring/README.md starts it, on port, as the role of dsn
sub start_exporter
{
	my ($dsn, $port, $out, $err) = @_;
	return IPC::Run::start(
		[ 'env', "DATA_SOURCE_NAME=$dsn", 'prometheus-postgres-exporter',
			"--web.listen-address=127.0.0.1:$port",
			"--extend.query-path=$monitoring/postgres_exporter.yml",
			'--auto-discover-databases', '--include-databases=postgres' ],
		'>', $out, '2>', $err);
}
my $exporter = start_exporter($dsn, $exporter_port, \$eout, \$eerr);
open(my $pc, '>', "$dir/prometheus.yml") or die;
print $pc <<"EOF";
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - $monitoring/prometheus-alerts.yml
scrape_configs:
  - job_name: postgres
    static_configs:
      - targets: ['127.0.0.1:$exporter_port']
EOF
close $pc;
my $prometheus = IPC::Run::start(
	[ 'prometheus', "--config.file=$dir/prometheus.yml", "--storage.tsdb.path=$dir/data",
		"--web.listen-address=127.0.0.1:$prom_port" ],
	'>', \$pout, '2>', \$perr);
END { $_->kill_kill for grep { defined } ($exporter, $prometheus) }

# Prometheus' HTTP API: the result vector of an instant query (undef: no answer)
sub promql
{
	my ($q) = @_;
	my $http = HTTP::Tiny->new(timeout => 10);
	my $res = $http->get("http://127.0.0.1:$prom_port/api/v1/query?" . $http->www_form_urlencode({ query => $q }));
	my $body = $res->{success} ? eval { $json->decode($res->{content}) } : undef;
	return undef unless $body && $body->{status} eq 'success';
	return $body->{data}{result};
}

# series of a query as "label,label=value" lines, sorted
sub prom_rows
{
	my ($q, @labels) = @_;
	my $res = promql($q) // return 'no answer';
	return join("\n", sort map {
		my $s = $_;
		join(',', map { $s->{metric}{$_} // '' } @labels) . '=' . (0 + $s->{value}[1])
	} @$res);
}

sub eventually
{
	my ($secs, $check) = @_;
	for (1 .. $secs * 4)
	{
		return 1 if $check->();
		usleep(250_000);
	}
	return $check->();
}

ok(eventually(60, sub { my $res = promql('eventgrid_dead_lettered_total'); $res && @$res == 3 * 10 }),
	'Prometheus scrapes the exporter: every reason of every subscription, at 0')
	or diag("exporter: $eerr\nprometheus: $perr");
is(prom_rows('pg_exporter_last_scrape_error'), '=0', 'every query of the exporter\'s configuration runs (no scrape error)');

# the workload
sql("INSERT INTO eventgrid.events (topic, event) SELECT 'shop', jsonb_build_object('id', 'o-' || g,
	'subject', '/orders/' || g, 'eventType', 'Shop.OrderCreated', 'eventTime', '2024-05-01T12:00:00Z',
	'data', jsonb_build_object('n', g)) FROM generate_series(1, 10) g");
ok(wait_for_sql($node, "SELECT sum(pending) FILTER (WHERE NOT paused) || '/' || sum(pending) FILTER (WHERE paused)
	FROM eventgrid.delivery_statistics", '0/10', 60), 'everything not paused is finished; 10 wait for the paused one');
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.dead_letters WHERE topic = 'alerts'", '10', 30),
	'the looping subscription dead-lettered the ten notifications it got');
# pull: six jobs, four received, three acknowledged, one released
sql("INSERT INTO eventgrid.events (topic, event) SELECT 'jobs', jsonb_build_object('specversion', '1.0', 'id', 'j-' || g,
	'source', '/jobs', 'type', 'Job.Queued') FROM generate_series(1, 6) g");
ok(wait_for_sql($node, "SELECT receivable_events FROM eventgrid.queue_metrics", '6'), 'six jobs receivable');
sql("CREATE TABLE taken AS SELECT lock_token FROM eventgrid.receive('jobs', 'workers', 4, 10)");
sql("SELECT eventgrid.acknowledge('jobs', 'workers', (SELECT array_agg(lock_token) FROM (SELECT lock_token FROM taken LIMIT 3) t))");
sql("SELECT eventgrid.release('jobs', 'workers', (SELECT array_agg(lock_token) FROM taken), 600)");

# the listener's counts of those publishes over HTTP (written every 5 s)
ok(wait_for_sql($node, "SELECT string_agg(outcome || '=' || requests_total, ',' ORDER BY outcome) FROM eventgrid.topic_publish_metrics"
		  . " WHERE topic = 'inbound'", 'Success=2,Unauthorized=1', 20), 'the listener wrote its counts');
is(sql("SELECT metric_name || '=' || value FROM eventgrid.metrics WHERE topic = 'inbound' AND metric_name = 'PublishFailCount'"),
	'PublishFailCount=1', 'metrics has PublishFailCount');
like(sql("SELECT value FROM eventgrid.metrics WHERE topic = 'inbound' AND metric_name = 'PublishSuccessLatencyInMs'"),
	qr/^\d+(\.\d+)?(e-\d+)?$/, 'and PublishSuccessLatencyInMs');

# every metric equals what SQL says
my %same = (
	'eventgrid_publish_success_total' => [ [qw(topic)],
		"SELECT topic || '=' || publish_success_total FROM eventgrid.topic_metrics" ],
	'eventgrid_http_publish_requests_total' => [ [qw(topic outcome)],
		"SELECT coalesce(topic, '') || ',' || outcome || '=' || requests_total FROM eventgrid.topic_publish_metrics" ],
	'eventgrid_unmatched_events_total' => [ [qw(topic)],
		"SELECT topic || '=' || unmatched_events_total FROM eventgrid.topic_metrics" ],
	'eventgrid_matched_events_total' => [ [qw(topic event_subscription)],
		"SELECT s.topic || ',' || s.name || '=' || c.matched FROM eventgrid.event_subscriptions s
		   JOIN eventgrid.subscription_counters c ON c.subscription_id = s.id" ],
	'eventgrid_delivery_success_total' => [ [qw(topic event_subscription)],
		"SELECT topic || ',' || subscription || '=' || delivered FROM eventgrid.delivery_statistics" ],
	'sum by (topic, event_subscription) (eventgrid_delivery_attempt_fail_total)' => [ [qw(topic event_subscription)],
		"SELECT topic || ',' || subscription || '=' || failed_attempts FROM eventgrid.delivery_statistics
		  WHERE failed_attempts > 0" ],
	'eventgrid_delivery_attempt_fail_total' => [ [qw(event_subscription outcome)],
		"SELECT subscription || ',' || outcome || '=' || count(*) FROM eventgrid.delivery_attempts a,
		        unnest(a.event_ids) WHERE outcome NOT IN ('Delivered', 'Probation') GROUP BY subscription, outcome" ],
	'sum by (topic, event_subscription) (eventgrid_dead_lettered_total)' => [ [qw(topic event_subscription)],
		"SELECT topic || ',' || subscription || '=' || dead_lettered FROM eventgrid.delivery_statistics" ],
	'eventgrid_dead_lettered_total > 0' => [ [qw(event_subscription reason)],
		"SELECT subscription_name || ',' || dead_letter_reason || '=' || count(*) FROM eventgrid.dead_letters
		  GROUP BY subscription_name, dead_letter_reason" ],
	'sum by (topic, event_subscription) (eventgrid_dropped_events_total)' => [ [qw(topic event_subscription)],
		"SELECT topic || ',' || subscription || '=' || dropped FROM eventgrid.delivery_statistics" ],
	'eventgrid_pending_events' => [ [qw(topic event_subscription)],
		"SELECT topic || ',' || subscription || '=' || pending FROM eventgrid.delivery_statistics" ],
	'eventgrid_event_subscription_paused' => [ [qw(topic event_subscription)],
		"SELECT topic || ',' || subscription || '=' || paused::int FROM eventgrid.delivery_statistics" ],
	'eventgrid_event_subscription_endpoint_on_probation' => [ [qw(topic event_subscription)],
		"SELECT topic || ',' || subscription || '=' || (state <> 'healthy')::int FROM eventgrid.endpoint_health" ],
	'count by (topic, event_subscription) (eventgrid_oldest_pending_event_age_seconds > 0)' => [ [qw(topic event_subscription)],
		"SELECT topic || ',' || subscription || '=1' FROM eventgrid.delivery_statistics WHERE pending > 0" ],
	# (a push delivery's latency is observed when it is delivered; an acknowledged pull event, counted
	# as delivered, has no latency)
	'eventgrid_delivery_latency_seconds_count' => [ [qw(topic event_subscription)],
		"SELECT topic || ',' || subscription || '=' || CASE delivery_mode WHEN 'queue' THEN 0 ELSE delivered END"
		  . " FROM eventgrid.delivery_statistics" ],
	'eventgrid_delivery_latency_seconds_bucket{le="+Inf"}' => [ [qw(topic event_subscription)],
		"SELECT topic || ',' || subscription || '=' || CASE delivery_mode WHEN 'queue' THEN 0 ELSE delivered END"
		  . " FROM eventgrid.delivery_statistics" ],
	'eventgrid_destination_processing_duration_seconds_count' => [ [qw(event_subscription)],
		"SELECT s.name || '=' || count(a.*) FROM eventgrid.event_subscriptions s
		   LEFT JOIN eventgrid.delivery_attempts a ON a.subscription = s.name AND a.http_status IS NOT NULL
		  GROUP BY s.name" ],
	'eventgrid_client_certificate_expiry_timestamp_seconds' => [ [qw(topic event_subscription)],
		"SELECT topic || ',' || subscription || '=' || extract(epoch FROM not_after)::float8
		   FROM eventgrid.event_subscription_certificates" ],
	'eventgrid_event_subscription_expiration_timestamp_seconds' => [ [qw(topic event_subscription)],
		"SELECT topic || ',' || name || '=' || extract(epoch FROM expiration_time)::float8
		   FROM eventgrid.event_subscriptions WHERE expiration_time IS NOT NULL" ],
	'eventgrid_queue_received_total' => [ [qw(topic event_subscription)],
		"SELECT topic || ',' || event_subscription || '=' || received_total FROM eventgrid.queue_metrics" ],
	'eventgrid_queue_acknowledged_total + eventgrid_queue_released_total' => [ [qw(topic event_subscription)],
		"SELECT topic || ',' || event_subscription || '=' || (acknowledged_total + released_total) FROM eventgrid.queue_metrics" ],
	'eventgrid_queue_receivable_events' => [ [qw(topic event_subscription)],
		"SELECT topic || ',' || event_subscription || '=' || receivable_events FROM eventgrid.queue_metrics" ],
	'eventgrid_queue_delayed_events' => [ [qw(topic event_subscription)],
		"SELECT topic || ',' || event_subscription || '=' || delayed_events FROM eventgrid.queue_metrics" ],
	'sum by (kind) (eventgrid_workers_running)' => [ [qw(kind)],
		"SELECT 'delivery=' || count(pid) FILTER (WHERE worker LIKE 'delivery%') || E'\\n' ||
		        'upkeep=' || count(pid) FILTER (WHERE worker = 'upkeep worker') FROM eventgrid.worker_status" ],
);
for my $q (sort keys %same)
{
	my ($labels, $query) = @{ $same{$q} };
	my $want = join("\n", sort split /\n/, sql($query));
	my $got;
	eventually(30, sub { $got = prom_rows($q, @$labels); $got eq $want });
	is($got, $want, "Prometheus' $q equals SQL");
}
# every histogram bucket list is cumulative and complete
my $buckets = promql('count by (event_subscription) (eventgrid_delivery_latency_seconds_bucket)');
ok(@$buckets && !grep({ $_->{value}[1] != 19 } @$buckets), 'each latency histogram has its 19 buckets');
my $noncumulative = promql('eventgrid_delivery_latency_seconds_bucket{le="0.005"} > on (topic, event_subscription) eventgrid_delivery_latency_seconds_bucket{le="1"}');
is(scalar @$noncumulative, 0, 'buckets are cumulative');
is(prom_rows('eventgrid_delivery_latency_seconds_bucket{event_subscription="fulfilment",le="0.01"}', 'le'), '0.01=0',
	'deliveries to an endpoint that takes 20 ms are not counted under 10 ms of latency');
is(prom_rows('eventgrid_destination_processing_duration_seconds_bucket{event_subscription="hanging",le="30"}', 'le'),
	'30=0', 'a request that timed out has no processing duration');

# metrics per topic (eventgrid.metrics_per_topic, set for a second exporter's
# role as monitoring/README.md shows): the same file's queries give one
# series per topic, with the sums of its subscriptions
sql("CREATE ROLE exporter_per_topic LOGIN IN ROLE pg_monitor");
sql("ALTER ROLE exporter_per_topic SET eventgrid.metrics_per_topic = on");
my $topic_port = PostgreSQL::Test::Cluster::get_free_port();
(my $topic_dsn = $dsn) =~ s/user=exporter/user=exporter_per_topic/;
my ($tout, $terr) = ('', '');
my $topic_exporter = start_exporter($topic_dsn, $topic_port, \$tout, \$terr);
# the exporter's text as {metric}{"label=value,..."} = value, eventgrid_* only
sub scrape_series
{
	my ($port) = @_;
	my $res = HTTP::Tiny->new(timeout => 30)->get("http://127.0.0.1:$port/metrics");
	return undef unless $res->{success};
	my %series;
	for my $line (split /\n/, $res->{content})
	{
		next unless $line =~ /^((?:eventgrid_|pg_exporter_last_scrape_error)\w*)\{?(.*?)\}? (\S+)$/;
		my ($name, $labels, $value) = ($1, $2, $3);
		my %l = $labels =~ /(\w+)="([^"]*)"/g;
		delete @l{qw(database server)};
		$series{$name}{ join(',', map { "$_=$l{$_}" } sort keys %l) } = $value;
	}
	return \%series;
}
my $per_topic;
ok(eventually(60, sub { $per_topic = scrape_series($topic_port); $per_topic && $per_topic->{eventgrid_pending_events} }),
	'the per-topic exporter answers') or diag("exporter: $terr");
is($per_topic->{pg_exporter_last_scrape_error}{''}, 0, 'every query runs per topic (no scrape error)');
my @subscription_labels = grep { /event_subscription=[^,]/ }
	map { keys %{ $per_topic->{$_} } } grep { /^eventgrid_(pending|matched|delivery|dead|dropped|destination|oldest|event_subscription_(paused|endpoint))/ } keys %$per_topic;
is(scalar @subscription_labels, 0, 'no series names an event subscription') or diag(join("\n", @subscription_labels[0 .. 4]));
# the sums of one scrape beside the counters read right after it (the
# delivery workers may still be matching and delivering: on a busy machine a
# scrape and a later read could straddle a claim), until a scrape finds no
# claim between them
my (@got, @want);
eventually(30, sub {
	my $scraped = scrape_series($topic_port) or return 0;
	$per_topic = $scraped;
	@got = (join(',', map { s/^event_subscription=,topic=//r . '=' . $per_topic->{eventgrid_matched_events_total}{$_} }
				sort keys %{ $per_topic->{eventgrid_matched_events_total} }),
		$per_topic->{eventgrid_dead_lettered_total}{'event_subscription=,reason=NonRetriableError,topic=shop'},
		$per_topic->{eventgrid_delivery_latency_seconds_count}{'event_subscription=,topic=shop'});
	@want = split /\|/, sql("SELECT (SELECT string_agg(topic || '=' || n, ',' ORDER BY topic) FROM (SELECT s.topic, sum(coalesce(c.matched, 0)) n
	       FROM eventgrid.event_subscriptions s LEFT JOIN eventgrid.subscription_counters c ON c.subscription_id = s.id
	      GROUP BY s.topic) x) || '|' ||
	    (SELECT count(*) FROM eventgrid.dead_letters WHERE topic = 'shop' AND dead_letter_reason = 'NonRetriableError') || '|' ||
	    (SELECT sum(delivered) FROM eventgrid.delivery_statistics WHERE topic = 'shop')");
	return join('|', map { $_ // '' } @got) eq join('|', @want);
});
is($got[0], $want[0], 'matched events: one series per topic, the sum of its subscriptions');
is($got[1], $want[1], 'dead letters of a topic by reason, summed');
is($got[2], $want[2], 'a topic\'s latency histogram counts every delivery of its subscriptions');
is(scalar(grep { /topic=shop$/ } keys %{ $per_topic->{eventgrid_delivery_latency_seconds_bucket} }), 19,
	'with its 19 buckets');
is($per_topic->{eventgrid_event_subscription_paused}{'event_subscription=,topic=shop'}, 0,
	'a topic with a paused subscription among others is not paused');
$topic_exporter->kill_kill;

ok(eventually(30, sub { my $a = promql('ALERTS{alertname="EventgridDeadLetters",alertstate="firing"}');
	$a && (join(',', sort map { $_->{metric}{event_subscription} } @$a) eq 'hanging,looping,refusing') }),
	'the dead-letter alert fires in Prometheus for the subscriptions that dead-lettered');
ok(eventually(30, sub { my $a = promql('ALERTS{alertname="EventgridEventsDropped",alertstate="firing"}');
	$a && (join(',', map { $_->{metric}{event_subscription} . '/' . $_->{metric}{reason} } @$a) eq 'overloaded/MaxDeliveryAttemptsExceeded') }),
	'the dropped-events alert fires for the subscription that drops');

# every query of the Grafana dashboard returns a series
my $dash = $json->decode(slurp_file("$monitoring/grafana-dashboard.json"));
my $n = 0;
for my $panel (@{ $dash->{panels} })
{
	for my $t (@{ $panel->{targets} })
	{
		(my $q = $t->{expr}) =~ s/\$__rate_interval/1m/g;
		$q =~ s/\$(database|topic)/.+/g;
		my $res = promql($q);
		ok($res && @$res > 0, "dashboard panel \"$panel->{title}\" ($t->{refId}) returns data") or diag($q);
		$n++;
	}
}
ok($n >= 10, "the dashboard has $n queries");

# promtool
my ($out, $err) = ('', '');
ok(IPC::Run::run([ 'promtool', 'check', 'rules', "$monitoring/prometheus-alerts.yml" ], '>', \$out, '2>', \$err),
	'promtool check rules passes') or diag("$out$err");
ok(IPC::Run::run([ 'promtool', 'test', 'rules', "$monitoring/prometheus-alerts.test.yml" ], '>', \$out, '2>', \$err),
	'promtool test rules passes') or diag("$out$err");

# dead-letter notifications, parsed by the Azure SDK (python3-azure)
my @eg = wait_for_requests($r, '/status/200/pager', 10, 30);
my @ce = wait_for_requests($r, '/status/200/pager-ce', 10, 30);
my $parse = <<'EOF';
import json, sys
from azure.core.messaging import CloudEvent
from azure.eventgrid import EventGridEvent
for line in sys.stdin:
    kind, body = line.split(" ", 1)
    body = json.loads(body)
    for e in (body if isinstance(body, list) else [body]):
        if kind == "eg":
            ev = EventGridEvent.from_dict(e)
            t, d = ev.event_type, ev.data
        else:
            ev = CloudEvent.from_dict(e)
            t, d = ev.type, ev.data
        print(t, d["topic"], d["eventSubscription"], d["id"], d["eventType"], d["subject"], d["deadLetterReason"],
              d["deliveryAttempts"], d["lastDeliveryOutcome"], d.get("lastHttpStatusCode", "-"),
              d["event"]["id"], d["publishTime"][:4], d["lastDeliveryAttemptTime"][:4])
EOF
my $in = join('', map { "eg $_->{body}\n" } @eg) . join('', map { "ce $_->{body}\n" } @ce);
($out, $err) = ('', '');
IPC::Run::run([ '/usr/bin/python3', '-c', $parse ], '<', \$in, '>', \$out, '2>', \$err);
my @lines = sort split /\n/, $out;
is(scalar @lines, 20, 'every dead-lettered and dropped event of shop notified once') or diag($err);
like($lines[0], qr{^Eventgrid\.EventSubscription\.EventDeadLettered shop refusing o-\d+ Shop\.OrderCreated /orders/\d+ NonRetriableError 1 BadRequest 400 o-\d+ \d{4} \d{4}$},
	'an Event Grid schema notification carries the dead letter record and the event');
like($lines[-1], qr{^Eventgrid\.EventSubscription\.EventDropped shop overloaded o-\d+ Shop\.OrderCreated /orders/\d+ MaxDeliveryAttemptsExceeded 1 Busy 503 o-\d+ \d{4} \d{4}$},
	'a CloudEvents notification of a dropped event, to a CloudEvents topic');
is(scalar(grep { /hanging/ } @lines), 0, 'a subscription without dead_letter_topic notifies no one');
is(sql("SELECT count(*) FROM eventgrid.events WHERE topic = 'alerts' AND event->>'subject' LIKE '/topics/alerts/%'"),
	'0', 'the notifications the looping subscription dead-lettered were not published again');
is(sql("SELECT count(*) FROM eventgrid.dead_letters WHERE subscription_name = 'looping'"), '10',
	'the looping subscription dead-lettered the ten notifications it got');

# update_event_subscription sets and clears it; an unknown topic is refused
sql("SELECT eventgrid.update_event_subscription('shop', 'hanging', dead_letter_topic => 'alerts')");
is(sql("SELECT dead_letter_topic FROM eventgrid.event_subscriptions WHERE name = 'hanging'"), 'alerts',
	'update_event_subscription sets dead_letter_topic');
sql("SELECT eventgrid.update_event_subscription('shop', 'hanging', dead_letter_topic => '')");
is(sql("SELECT coalesce(dead_letter_topic, 'none') FROM eventgrid.event_subscriptions WHERE name = 'hanging'"), 'none',
	"'' clears it");
like(sql_error($node, "SELECT eventgrid.update_event_subscription('shop', 'hanging', dead_letter_topic => 'no-such')"),
	qr/42704.*dead_letter_topic "no-such" does not exist/s, 'an unknown dead_letter_topic is refused (42704)');
sql("SELECT eventgrid.drop_topic('alerts-ce')");
is(sql("SELECT coalesce(dead_letter_topic, 'none') FROM eventgrid.event_subscriptions WHERE name = 'overloaded'"),
	'none', 'dropping the notification topic stops the notifications');

done_testing();
