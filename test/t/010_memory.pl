# The worker's memory is bounded by eventgrid.max_bytes_in_flight (issue
# "Trust", item 7): a backlog of 1 MB events drains with the worker's private
# memory (RssAnon: heap and malloc, not shared buffers) under the bound plus
# a small constant, where it used to claim a thousand such events at once.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $bound_mb = 16;
my $slack_mb = 24;
my $node = new_node('memory', 'eventgrid.max_bytes_in_flight' => "'${bound_mb}MB'", 'eventgrid.delivery_paused' => 'on');
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

$node->stop;
done_testing();
