# The worker's memory is bounded by eventgrid.max_bytes_in_flight (issue
# "Trust", item 7): a backlog of 1 MB events drains with the worker's private
# memory (RssAnon: heap and malloc, not shared buffers) under the bound plus
# a small constant, where it used to claim a thousand such events at once;
# and many subscriptions sharing one backed-up endpoint host keep what the
# worker holds under the bound ("Trust, third pass", item 8).
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);

my $bound_mb = 16;
my $slack_mb = 24;
# the product's default response timeout, not the tests' 2 s: a receiver that
# never hangs, on a machine that may be loaded, must not be timed out into
# probation (TimedOut, then held deliveries pushed along the retry schedule)
my $node = new_node('memory', 'eventgrid.max_bytes_in_flight' => "'${bound_mb}MB'", 'eventgrid.delivery_paused' => 'on',
	'eventgrid.response_timeout' => "'30s'");
my $r = start_receiver();

sub sql { return $node->safe_psql('postgres', shift) }
# requests logged so far, counted without decoding megabytes of bodies
sub logged
{
	open(my $fh, '<', $r->{log}) or return 0;
	my $n = 0;
	$n++ while <$fh>;
	close $fh;
	return $n;
}

sub rss_anon_kb
{
	my $pid = shift;
	open(my $fh, '<', "/proc/$pid/status") or return 0;
	while (<$fh>) { return $1 if /^RssAnon:\s+(\d+) kB/ }
	return 0;
}

sql("SELECT eventgrid.create_topic('big', 'CustomEventSchema')");
sql("SELECT eventgrid.create_event_subscription('big', 'sink', '$r->{url}/status/200/big')");
sql("INSERT INTO eventgrid.events (topic, event) SELECT 'big', jsonb_build_object('n', i, 'd', repeat(md5(i::text), 32760)) FROM generate_series(1, 60) i");
is(sql("SELECT count(*) FROM eventgrid.events WHERE octet_length(event::text) > 1000000"), '60', 'a backlog of 60 events of about 1 MB');

my $pid = sql("SELECT pid FROM pg_stat_activity WHERE backend_type = 'eventgrid delivery worker'");
my $base = rss_anon_kb($pid);
sql("ALTER SYSTEM SET eventgrid.delivery_paused = off; SELECT pg_reload_conf()");
my $peak = $base;
for (1 .. 1200)
{
	my $kb = rss_anon_kb($pid);
	$peak = $kb if $kb > $peak;
	last if logged() >= 60;
	usleep(20_000);
}
is(scalar(requests($r, '/status/200/big')), 60, 'all 60 events delivered');
my $grew_mb = ($peak - $base) / 1024;
note(sprintf('worker private memory: %.1f MB before, peak %.1f MB (+%.1f MB) with max_bytes_in_flight = %d MB',
	$base / 1024, $peak / 1024, $grew_mb, $bound_mb));
cmp_ok($grew_mb, '<', $bound_mb + $slack_mb, "peak private memory growth under the bound plus $slack_mb MB");
ok(wait_for_sql($node, "SELECT coalesce(sum(pending), 0) FROM eventgrid.delivery_statistics", '0'), 'the backlog is gone');

# --- many subscriptions, one endpoint host that backs up (issue "Trust, third
# pass", item 8) ---------------------------------------------------------------
# 40 subscriptions fan 600 small events out to one receiver, whose host is
# backed up the whole time: what waits on it must not free the bound for
# another claim of half the limit (the worker then held up to twice the
# bound, and more the more subscriptions shared the host).  The status line
# says what the worker holds, every 250 ms.
my $small_kb = 2048;
sql("ALTER SYSTEM SET eventgrid.max_bytes_in_flight = '${small_kb}kB'; ALTER SYSTEM SET eventgrid.delivery_paused = on; SELECT pg_reload_conf()");
sql("SELECT eventgrid.create_topic('fan')");
sql("SELECT eventgrid.create_event_subscription('fan', 'fan-' || i, '$r->{url}/status/200/fan' || i) FROM generate_series(1, 40) i");
sql("INSERT INTO eventgrid.events (topic, event) SELECT 'fan', jsonb_build_object('id', i::text, 'subject', '/s', 'eventType', 'T', "
	  . "'eventTime', '2024-05-01T12:00:00Z', 'data', jsonb_build_object('pad', repeat('x', 900))) FROM generate_series(1, 600) i");
sleep 1;
sql("ALTER SYSTEM SET eventgrid.delivery_paused = off; SELECT pg_reload_conf()");
# sampled every 5 ms from within the server: units of work replace the
# status line while they run, and each restores it when done
my ($max_held, $samples) = split /\|/, sql(q{
CREATE FUNCTION pg_temp.held_while_draining() RETURNS text LANGUAGE plpgsql AS $$
DECLARE
	a text;
	m text[];
	top bigint := 0;
	n int := 0;
BEGIN
	FOR i IN 1 .. 24000 LOOP
		PERFORM pg_stat_clear_snapshot();
		SELECT activity INTO a FROM eventgrid.worker_status WHERE worker = 'delivery worker 1';
		m := regexp_match(a, ', (\d+) kB held;');
		IF m IS NOT NULL THEN
			n := n + 1;
			top := greatest(top, m[1]::bigint);
		END IF;
		EXIT WHEN i % 20 = 0 AND (SELECT coalesce(sum(pending), 0) FROM eventgrid.delivery_statistics WHERE topic = 'fan') = 0;
		PERFORM pg_sleep(0.005);
	END LOOP;
	RETURN top || '|' || n;
END $$;
SELECT pg_temp.held_while_draining();});
note("the worker held at most $max_held kB in $samples samples, with max_bytes_in_flight = $small_kb kB");
# at least one sample: under load the worker is inside a unit of work (whose
# status line replaces this one) nearly all the time (a CI run caught it twice
# in 7 s); the next check says that a sample caught the bound filled
cmp_ok($samples, '>=', 1, 'the status line showed the bytes held while delivering');
cmp_ok($max_held, '>', $small_kb / 2, 'the backlog filled the bound');
cmp_ok($max_held, '<=', $small_kb * 1.25, 'held bytes stay under max_bytes_in_flight (and a claim\'s estimate error) with the host backed up');
is(sql("SELECT sum(delivered) FROM eventgrid.delivery_statistics WHERE topic = 'fan'"), '24000', 'all 24,000 deliveries made');

# --- the worker's peak does not grow with subscriptions -----------------------
# An nginx sink answers 204 at once. 96,000 deliveries of 1 KB events with a
# 4 MB bound, first through 8 subscriptions (12,000 events), then through 96
# (1,000 events), each drained by a delivery worker started for it: the
# peak private memory of the second stays within 32 MB of the first's
# (19.7 and 20.5 MB beside four other tests; 20.0 and 36.1 MB once under
# the whole suite's load, a gap not yet explained). A worker of its own for
# each drain and the same number of deliveries, because the process's resident
# memory, which is what is measured, keeps what glibc keeps of all the
# process did before and grows with the length of a drain: one worker for
# both drains, 2,000 events each, gave 22.5 and 49.1 MB beside the whole
# suite. The claim of 028066f, which read up to 1,000 rows of every busy
# subscription before cutting at the byte budget and could hold the bound
# twice over, gives 24.0 and 65.0 MB alone.
my $dir = $PostgreSQL::Test::Utils::tmp_check . '/memory_nginx';
mkdir $dir;
my $sink = PostgreSQL::Test::Cluster::get_free_port();
start_nginx($dir, <<"HTTP");
    access_log off;
    client_body_buffer_size 64k;
    server { listen 127.0.0.1:$sink; location / { return 204; } }
HTTP

sql("ALTER SYSTEM SET eventgrid.max_bytes_in_flight = '4MB'; SELECT pg_reload_conf()");

# peak RssAnon of the delivery workers (kB) while topic $t drains
sub drain_peak
{
	my ($t, $nsubs, $nevents) = @_;
	sql("SELECT eventgrid.create_topic('$t')");
	sql("SELECT eventgrid.pause_delivery('$t')");
	sql("SELECT eventgrid.create_event_subscription('$t', 'sub-' || i, 'http://127.0.0.1:$sink/' || i) FROM generate_series(1, $nsubs) i");
	sql("INSERT INTO eventgrid.events (topic, event) SELECT '$t', jsonb_build_object('id', i::text, 'subject', '/s', 'eventType', 'T', "
		  . "'eventTime', '2024-05-01T12:00:00Z', 'data', jsonb_build_object('pad', repeat('x', 900))) FROM generate_series(1, $nevents) i");
	# a worker of its own for each drain: its peak is this drain's alone
	restart_workers($node);
	sql("SELECT eventgrid.resume_delivery('$t')");
	my $peak = 0;
	my ($moved_at, $last, $told) = (time, -1, 0);
	# at most 5 minutes (a drain takes 10 to 20 s); what the workers were
	# doing is printed once nothing was delivered for 30 s
	while (time < $moved_at + 300)
	{
		for my $p (split /\n/, sql("SELECT pid FROM pg_stat_activity WHERE backend_type = 'eventgrid delivery worker'"))
		{
			my $kb = rss_anon_kb($p);
			$peak = $kb if $kb > $peak;
		}
		my ($pending, $delivered) = split /\|/, sql("SELECT coalesce(sum(pending), 0) || '|' || coalesce(sum(delivered), 0) "
			  . "FROM eventgrid.delivery_statistics WHERE topic = '$t'");
		last if $pending eq '0';
		($moved_at, $last, $told) = (time, $delivered, 0) if $delivered ne $last;
		if (!$told && time > $moved_at + 30)
		{
			$told = 1;
			diag("$t: no delivery for 30 s, $delivered delivered, $pending pending; workers, endpoint health, outcomes:\n"
				  . sql("SELECT worker, pid, state, activity, wait_event FROM eventgrid.worker_status") . "\n"
				  . sql("SELECT state, probation_until, consecutive_failures, last_failure_outcome, count(*) FROM eventgrid.endpoint_health "
					  . "WHERE topic = '$t' GROUP BY 1, 2, 3, 4") . "\n"
				  . sql("SELECT outcome, count(*) FROM eventgrid.delivery_attempts WHERE topic = '$t' GROUP BY 1"));
		}
		usleep(20_000);
	}
	is(sql("SELECT sum(delivered) FROM eventgrid.delivery_statistics WHERE topic = '$t'"), $nevents * $nsubs,
		"$nsubs subscriptions: every delivery made");
	return $peak;
}
my $few = drain_peak('few', 8, 12000);
my $many = drain_peak('many', 96, 1000);
note(sprintf('peak private memory with a 4 MB bound: %.1f MB with 8 subscriptions, %.1f MB with 96', $few / 1024, $many / 1024));
cmp_ok(($many - $few) / 1024, '<', 32, 'twelve times the subscriptions: the peak grows by less than 32 MB');

$node->stop;
done_testing();
