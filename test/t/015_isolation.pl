# Isolation (issue "Endpoint health", part 2): requests wait in one queue
# per endpoint host and hosts take turns; no host has more than
# eventgrid.max_requests_per_endpoint requests in flight; a host with a
# backlog claims nothing more until it drains.  Under 500 event
# subscriptions to a port where nothing listens and 200 to an endpoint that
# accepts and never answers (eventgrid.response_timeout at its default
# 30 s), a healthy subscription gets every event.  The healthy
# subscription's latency (commit -> arrival) and the worker's peak file
# descriptors and memory are printed; they are figures, not assertions.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep time);

my $events = $ENV{EG_ISOLATION_EVENTS} // 40;
my $interval = 0.5;

my $node = new_node('isolation', 'eventgrid.response_timeout' => "'30s'");
my $good = start_receiver();
my $bad = start_receiver();
my $refused = PostgreSQL::Test::Cluster::get_free_port();
my $json = JSON::PP->new;

sub sql { return $node->safe_psql('postgres', shift) }

sql("SELECT eventgrid.create_topic('load')");
sql("SELECT eventgrid.create_event_subscription('load', 'refused-' || i, 'http://127.0.0.1:$refused/refused')"
	  . " FROM generate_series(1, 500) i");
sql("SELECT eventgrid.create_event_subscription('load', 'hanging-' || i, '$bad->{url}/hang/hanging')"
	  . " FROM generate_series(1, 200) i");
sql("SELECT eventgrid.create_event_subscription('load', 'healthy', '$good->{url}/status/200/healthy')");
my $limit = sql("SHOW eventgrid.max_requests_per_endpoint");
start_workers($node);
my $worker = sql("SELECT pid FROM pg_stat_activity WHERE backend_type = 'eventgrid delivery worker'");
ok($worker =~ /^\d+$/, 'the delivery worker runs');

sub fds { opendir(my $d, "/proc/$worker/fd") or return 0; my $n = grep { !/^\./ } readdir($d); closedir $d; return $n }

sub status_kb
{
	my $field = shift;
	open(my $f, '<', "/proc/$worker/status") or return 0;
	while (<$f>) { return $1 if /^$field:\s+(\d+) kB/ }
	return 0;
}

# one event every $interval s, each carrying the time just before its commit
my %sent;
my $peak_fds = 0;
my $peak_anon = 0;
for my $i (1 .. $events)
{
	my $t = time;
	sql("SELECT eventgrid.publish('load', '" . eg_event("e-$i") . "')");
	$sent{"e-$i"} = $t;
	$peak_fds = fds() if fds() > $peak_fds;
	$peak_anon = status_kb('RssAnon') if status_kb('RssAnon') > $peak_anon;
	sleep($interval - (time - $t)) if time - $t < $interval;
}
my @got = wait_for_requests($good, '/status/200/healthy', $events, 60);
$peak_fds = fds() if fds() > $peak_fds;

my %seen;
my @latency;
for my $req (@got)
{
	my $id = $json->decode($req->{body})->[0]{id};
	$seen{$id}++;
	push @latency, 1000 * ($req->{time} - $sent{$id});
}
is(scalar(keys %seen), $events, 'the healthy subscription got every event');
ok(!(grep { $_ != 1 } values %seen), 'each exactly once');

my @hanging = requests($bad, '/hang/hanging');
my $max_concurrent = 0;
for (@hanging) { $max_concurrent = $_->{concurrent} if $_->{concurrent} > $max_concurrent }
cmp_ok($max_concurrent, '<=', $limit, "the hanging endpoint never held more than max_requests_per_endpoint ($limit) connections");
cmp_ok(scalar(@hanging), '>', 0, 'the hanging endpoint got requests too (not starved)');
ok(wait_for_sql($node, "SELECT DISTINCT state || ' ' || probation_cause FROM eventgrid.endpoint_health WHERE subscription LIKE 'refused-%'",
		'probation SocketError'), 'the refusing endpoint is on probation');
cmp_ok($peak_fds, '<=', 2 * sql("SHOW eventgrid.max_concurrent_requests") + 64,
	'file descriptors stay bounded (requests in flight, the connection cache, the server\'s own)');

@latency = sort { $a <=> $b } @latency;
my $pct = sub { my $p = shift; return $latency[ int($p * $#latency + 0.5) ] };
diag(sprintf("isolation: healthy subscription latency over %d events (500 refused + 200 hanging subscriptions, "
		  . "30 s response timeout): p50 %.1f ms, p95 %.1f ms, max %.1f ms",
		$events, $pct->(0.5), $pct->(0.95), $latency[-1]));
diag(sprintf("isolation: worker peaks (sampled): %d file descriptors, %d kB private memory (RssAnon); hanging endpoint: %d requests, at most %d at once",
		$peak_fds, $peak_anon, scalar(@hanging), $max_concurrent));

$node->stop('immediate');
done_testing();
