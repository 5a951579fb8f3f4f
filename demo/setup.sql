-- Demo configuration: two topics; a subscription that receives events, one
-- with advanced filters on the event's data, one with output batching, one
-- whose endpoint refuses them (HTTP 400) with dead-lettering on, one whose
-- endpoint fails twice and then accepts, and one whose endpoint always fails
-- (HTTP 500) with at most 3 delivery attempts.
-- :receiver is the receiver's base URL.
CREATE EXTENSION eventgrid;
SELECT eventgrid.create_topic('storage');
SELECT eventgrid.create_topic('orders-ce', 'CloudEventSchemaV1_0');
SELECT eventgrid.create_event_subscription('storage', 'blob-created', :'receiver' || '/status/200/blob-created',
       included_event_types => ARRAY['Microsoft.Storage.BlobCreated'],
       subject_begins_with => '/blobServices/default/containers/images/');
SELECT eventgrid.set_delivery_property('storage', 'blob-created', 'X-Api-Key', 'demo-secret', is_secret => true);
SELECT eventgrid.create_event_subscription('storage', 'small-text-blobs', :'receiver' || '/status/200/small-text-blobs',
       advanced_filters => '[{"operatorType": "StringIn", "key": "data.contentType", "values": ["text/plain"]},
                             {"operatorType": "NumberLessThan", "key": "data.contentLength", "value": 1024}]');
SELECT eventgrid.create_event_subscription('storage', 'broken-endpoint', :'receiver' || '/status/400/broken',
       deadletter => true);
SELECT eventgrid.create_event_subscription('orders-ce', 'orders', :'receiver' || '/status/202/orders');
SELECT eventgrid.create_event_subscription('storage', 'storage-batched', :'receiver' || '/status/200/batched',
       max_events_per_batch => 10, preferred_batch_size_in_kilobytes => 64);
-- the receiver answers the n-th request to this path with the n-th status: 500, 502, then 200
SELECT eventgrid.create_event_subscription('orders-ce', 'flaky-endpoint', :'receiver' || '/seq/500,502,200/flaky');
SELECT eventgrid.create_event_subscription('orders-ce', 'always-failing', :'receiver' || '/status/500/failing',
       max_delivery_attempts => 3, deadletter => true);
