# Retry-After (issue "Receivers can verify and push back", item 2): a
# retried answer's Retry-After, in delta-seconds or as an HTTP-date, puts
# the next attempt at the later of that time and the schedule's own step,
# at most eventgrid.max_retry_after ahead, and never past the event's
# time-to-live; the attempt history says what the endpoint asked for.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = new_node('retry_after');
my $r = start_receiver();
my $u = $r->{url};

sub sql { return $node->safe_psql('postgres', shift) }

sql("SELECT eventgrid.create_topic('pushback')");
my %subs = (
	'delta' => '/status/429/delta?retry_after=600',
	'date' => '/status/503/date?retry_after=%2B120',
	'short' => '/status/503/short?retry_after=5',
	'capped' => '/status/429/capped?retry_after=99999',
	'garbled' => '/status/429/garbled?retry_after=soon',
	'negative' => '/status/429/negative?retry_after=-5',
	'long' => '/status/429/long?retry_after=long',
	'ttl' => '/status/429/ttl?retry_after=600');
for my $s (sort keys %subs)
{
	sql("SELECT eventgrid.create_event_subscription('pushback', '$s', '$u$subs{$s}', subject_begins_with => '/$s',"
		  . " deadletter => true" . ($s eq 'ttl' ? ", event_ttl => 1" : '') . ")");
	sql("SELECT eventgrid.publish('pushback', '" . eg_event("$s-1", subject => "/$s") . "')");
}
ok(wait_recorded($node, $_, 1), "$_: the first attempt failed and waits for a retry") for sort keys %subs;

is(planned_wait($node, 'delta'), '600', '429 with Retry-After: 600 (delta-seconds): the retry waits 600 s, not the 10 s step');
my $date_wait = planned_wait($node, 'date');
ok($date_wait >= 118 && $date_wait <= 121, "503 with Retry-After as an HTTP-date 120 s ahead: the retry waits $date_wait s");
is(planned_wait($node, 'short'), '30', 'Retry-After: 5 after a 503: the schedule\'s own 30 s step is later and counts');
is(planned_wait($node, 'capped'), '3600', 'Retry-After: 99999: at most eventgrid.max_retry_after (1 h)');
is(planned_wait($node, 'garbled'), '10', 'a Retry-After libcurl cannot read is ignored: the 10 s step');
is(planned_wait($node, 'negative'), '10', 'a negative one too');
my $long_wait = planned_wait($node, 'long');
ok($long_wait == 10 || $long_wait == 3600, "a 10,000-digit one changes nothing but the capped wait ($long_wait s)");

sub error_of
{
	my ($sub) = @_;
	return sql("SELECT outcome || ' | ' || http_status || ' | ' || coalesce(error, '') FROM eventgrid.delivery_attempts"
		  . " WHERE subscription = '$sub' ORDER BY id DESC LIMIT 1");
}
is(error_of('delta'), 'Busy | 429 | Retry-After: 600 s', 'the attempt history says what the endpoint asked for');
# (libcurl 8 reads at most six hours: 21600 s; 7.88 the value sent)
like(error_of('capped'), qr/^Busy \| 429 \| Retry-After: (99999|21600) s, taken as 3600 s \(eventgrid\.max_retry_after\)$/,
	'and how much of it was taken');
is(error_of('garbled'), 'Busy | 429 | ', 'nothing for an unreadable one');

# the retry is not attempted before its time, and is once it comes
advance_clock($node, 300);
sleep 2;
is(sql("SELECT attempts FROM eventgrid.retries r JOIN eventgrid.event_subscriptions s ON s.id = r.subscription_id"
		  . " WHERE s.name = 'delta'"), '1', 'five minutes on, the delta retry has not been attempted');
advance_clock($node, 301);
ok(wait_recorded($node, 'delta', 2), 'ten minutes on, it has');

# the time-to-live still ends it: the retry came due after the event's minute
ok(wait_for_sql($node, "SELECT dead_letter_reason || ' ' || delivery_attempts FROM eventgrid.dead_letter_events"
		  . " WHERE subscription_name = 'ttl'", 'TimeToLiveExceeded 1', 30),
	'a Retry-After beyond the time-to-live: dead-lettered TimeToLiveExceeded, no second attempt');

# eventgrid.max_retry_after = 0 ignores Retry-After
sql("ALTER SYSTEM SET eventgrid.max_retry_after = 0; SELECT pg_reload_conf()");
sql("SELECT eventgrid.create_event_subscription('pushback', 'ignored', '$u/status/429/ignored?retry_after=600',"
	  . " subject_begins_with => '/ignored')");
sleep 1;
sql("SELECT eventgrid.publish('pushback', '" . eg_event('ignored-1', subject => '/ignored') . "')");
ok(wait_recorded($node, 'ignored', 1), 'with eventgrid.max_retry_after = 0');
is(planned_wait($node, 'ignored'), '10', 'Retry-After is ignored: the 10 s step');

$node->stop;
done_testing();
