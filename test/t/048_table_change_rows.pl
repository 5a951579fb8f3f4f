# Table changes as the table saw them (issue "Trust, third pass", item 5):
#  - an UPDATE that moves five rows to another partition, whose BEFORE
#    INSERT trigger skips two of them: the three moved rows are published as
#    Updated with their own old and new versions (0.10.0 paired old id n
#    with new id n+1), then the two the table lost as Deleted; the same
#    with a primary key changed in the same statement, and for a table
#    without a primary key;
#  - the same move with text values of 10-60 characters, and 3,000 rows
#    under work_mem = 64kB (the transition tables spill to disk): 0.21.0's
#    pairing left its copies of the rows in slots whose memory it had freed,
#    and the backend crashed (signal 11) (issue "Trust, fifth pass", item 2);
#  - a json column holding "\u0000", which jsonb cannot hold: the
#    application's INSERT succeeds once the table is published, and the
#    value is carried as its JSON text (a string).
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# (the events are read back from the event tables: no rotation empties them meanwhile)
my $node = new_node('table_change_rows', 'eventgrid.event_table_rotation' => "'1h'");
my $json = JSON::PP->new->canonical;
sub sql { return $node->safe_psql('postgres', shift) }

sql(q{
	SELECT eventgrid.create_topic('moves');
	CREATE TABLE parts (id int, region text, note text, PRIMARY KEY (id, region)) PARTITION BY LIST (region);
	CREATE TABLE parts_eu PARTITION OF parts FOR VALUES IN ('eu');
	CREATE TABLE parts_us PARTITION OF parts FOR VALUES IN ('us');
	CREATE FUNCTION skip_even() RETURNS trigger LANGUAGE plpgsql AS
	  $$ BEGIN IF NEW.id % 2 = 0 THEN RETURN NULL; END IF; RETURN NEW; END $$;
	CREATE TRIGGER skip_even BEFORE INSERT ON parts_us FOR EACH ROW EXECUTE FUNCTION skip_even();
	SELECT eventgrid.publish_table_changes('parts', 'moves');
	INSERT INTO parts SELECT i, 'eu', 'n' || i FROM generate_series(1, 5) i;
});

# the events of the last statement on topic $topic: "type old-id>new-id" each
sub changes
{
	my ($topic, $since) = @_;
	my @rows = split /\n/, sql("SELECT event::text FROM eventgrid.events WHERE topic = '$topic' AND id > $since ORDER BY id");
	return join(', ', map {
		my $e = $json->decode($_);
		my ($type) = $e->{eventType} =~ /\.(\w+)$/;
		my ($o, $n) = map { defined $_ ? $_->{id} : '-' } @{ $e->{data} }{qw(old new)};
		"$type $o>$n"
	} @rows);
}
my $mark = sub { return sql("SELECT coalesce(max(id), 0) FROM eventgrid.events") };

my $m = $mark->();
sql("UPDATE parts SET region = 'us' WHERE region = 'eu'");
is(sql("SELECT string_agg(id::text, ',' ORDER BY id) FROM parts"), '1,3,5', 'the table kept rows 1, 3 and 5 (2 and 4 skipped)');
is(changes('moves', $m), 'Updated 1>1, Updated 3>3, Updated 5>5, Deleted 2>-, Deleted 4>-',
	'each moved row paired with its own old version; the skipped ones published as Deleted');
my $deleted = $json->decode(sql("SELECT event::text FROM eventgrid.events WHERE topic = 'moves' AND id > $m"
	  . " AND event->>'eventType' LIKE '%Deleted' ORDER BY id LIMIT 1"));
is($deleted->{data}{operation} . ' ' . $deleted->{data}{old}{region} . ' ' . $deleted->{subject}, 'DELETE eu /public/parts/2/eu',
	'a Deleted event as a DELETE makes it: operation, the old row, its subject');
is(sql("SELECT bool_and(event_bytes = octet_length(event::text)) FROM eventgrid.events WHERE topic = 'moves'"), 't',
	'every event sized right, Updated and Deleted alike');

# the key changes too: rows move back with new ids; the even new ids are skipped
sql("INSERT INTO parts VALUES (7, 'eu', 'x'), (9, 'eu', 'y')");
$m = $mark->();
sql("UPDATE parts SET region = 'us', id = id + 1 WHERE region = 'eu'");
is(changes('moves', $m), 'Deleted 7>-, Deleted 9>-', 'rows whose new key is skipped: both Deleted');
sql("TRUNCATE parts; INSERT INTO parts VALUES (10, 'eu', 'a'), (11, 'eu', 'b'), (13, 'eu', 'c')");
$m = $mark->();
sql("UPDATE parts SET region = 'us', id = CASE WHEN id = 11 THEN 21 ELSE id END WHERE region = 'eu'");
is(changes('moves', $m), 'Updated 11>21, Updated 13>13, Deleted 10>-', 'a changed key still pairs with its own old version');

# a table without a primary key: paired by place, the skipped at the end
sql(q{
	SELECT eventgrid.create_topic('keyless');
	CREATE TABLE loose (id int, region text) PARTITION BY LIST (region);
	CREATE TABLE loose_eu PARTITION OF loose FOR VALUES IN ('eu');
	CREATE TABLE loose_us PARTITION OF loose FOR VALUES IN ('us');
	CREATE TRIGGER skip_even BEFORE INSERT ON loose_us FOR EACH ROW EXECUTE FUNCTION skip_even();
	SELECT eventgrid.publish_table_changes('loose', 'keyless');
	INSERT INTO loose VALUES (1, 'eu'), (3, 'eu'), (4, 'eu');
});
$m = $mark->();
sql("UPDATE loose SET region = 'us'");
is(changes('keyless', $m), 'Updated 1>1, Updated 3>3, Deleted 4>-', 'without a key: paired by place, the skipped row last');

# --- the same moves with values of 10-60 characters, then 3,000 rows under
# a small work_mem: each statement completes (no backend crash) and the
# events say what the table shows
sql(q{
	SELECT eventgrid.create_topic('wide');
	CREATE TABLE wide (id int, region text, note text, PRIMARY KEY (id, region)) PARTITION BY LIST (region);
	CREATE TABLE wide_eu PARTITION OF wide FOR VALUES IN ('eu');
	CREATE TABLE wide_us PARTITION OF wide FOR VALUES IN ('us');
	CREATE TRIGGER skip_even BEFORE INSERT ON wide_us FOR EACH ROW EXECUTE FUNCTION skip_even();
	SELECT eventgrid.publish_table_changes('wide', 'wide');
});
my @lengths = split /,/, ($ENV{EG_TEST_048_LENGTHS} // '10,17,25,33,42,60');
for my $len (@lengths)
{
	sql("TRUNCATE wide; INSERT INTO wide SELECT i, 'eu', repeat('n', $len) FROM generate_series(1, 5) i");
	$m = $mark->();
	my ($ret, $out, $err) = $node->psql('postgres', "UPDATE wide SET region = 'us' WHERE region = 'eu'");
	is($ret . $err, '0', "moving rows with $len-character values completes");
	is(changes('wide', $m), 'Updated 1>1, Updated 3>3, Updated 5>5, Deleted 2>-, Deleted 4>-',
		"and publishes what the table shows ($len characters)");
}
sql("TRUNCATE wide; INSERT INTO wide SELECT i, 'eu', md5(i::text) || i FROM generate_series(1, 3000) i");
$m = $mark->();
my ($ret, $out, $err) = $node->psql('postgres', "SET work_mem = '64kB'; UPDATE wide SET region = 'us' WHERE region = 'eu'");
is($ret . $err, '0', '3,000 rows moved under work_mem = 64kB');
is(sql("SELECT count(*) FILTER (WHERE event->>'eventType' LIKE '%.Updated'
		   AND event->'data'->'new'->>'id' = event->'data'->'old'->>'id') || ' '
		|| count(*) FILTER (WHERE event->>'eventType' LIKE '%.Deleted' AND (event->'data'->'old'->>'id')::int % 2 = 0)
		FROM eventgrid.events WHERE topic = 'wide' AND id > $m"), '1500 1500',
	'each odd row Updated with its own old version, each even one Deleted');
is(sql("SELECT count(*) FROM wide"), '1500', 'the table kept the odd rows');
is($node->safe_psql('postgres', 'SELECT 1'), '1', 'the server is still up');

# --- a json value jsonb cannot hold
sql(q{
	SELECT eventgrid.create_topic('docs');
	CREATE TABLE docs (id int PRIMARY KEY, doc json, other json);
	SELECT eventgrid.publish_table_changes('docs', 'docs');
});
($ret, $out, $err) = $node->psql('postgres',
	q{INSERT INTO docs VALUES (1, '{"a": "x\u0000y"}', '{"b": "\\\\u0000"}')});
is($ret . $err, '0', 'a json value holding \u0000 is inserted into a published table');
my $e = $json->decode(sql("SELECT event::text FROM eventgrid.events WHERE topic = 'docs'"));
is($e->{data}{new}{doc}, '{"a": "x\u0000y"}', 'and carried as its JSON text, a string');
is($json->encode($e->{data}{new}{other}), '{"b":"\\\\u0000"}', 'an escaped backslash before u0000 stays JSON');
is(sql("SELECT event_bytes = octet_length(event::text) FROM eventgrid.events WHERE topic = 'docs'"), 't', 'sized right');

$node->stop;
done_testing();
