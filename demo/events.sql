-- Sample events for the demo, modelled on the Event Grid samples in the
-- "delivery and retry" article: a Microsoft.Storage.BlobCreated event in the
-- Event Grid schema and a CloudEvents 1.0 event.
INSERT INTO eventgrid.events (topic, event) VALUES
('storage', '{
    "id": "93902694-901e-008f-6f95-7153a806873c",
    "eventTime": "2020-08-13T17:18:13.1647262Z",
    "eventType": "Microsoft.Storage.BlobCreated",
    "subject": "/blobServices/default/containers/images/blobs/myBlobFile.txt",
    "data": {
        "api": "PutBlob",
        "clientRequestId": "c0d879ad-88c8-4bbe-8774-d65888dc2038",
        "requestId": "93902694-901e-008f-6f95-7153a8000000",
        "eTag": "0x8D83FACDC0C3402",
        "contentType": "text/plain",
        "contentLength": 0,
        "blobType": "BlockBlob",
        "url": "https://myegteststgfoo.blob.core.windows.net/images/myBlobFile.txt",
        "sequencer": "00000000000000000000000000015508000000000005101c",
        "storageDiagnostics": { "batchId": "cfb32f79-3006-0010-0095-711faa000000" }
    }
}'),
('storage', '{
    "id": "0b5b3c2e-6a1f-4d57-9e8b-3c1f2e9d4a71",
    "eventTime": "2020-08-13T17:19:02.0012345Z",
    "eventType": "Microsoft.Storage.BlobDeleted",
    "subject": "/blobServices/default/containers/images/blobs/old.png",
    "data": { "api": "DeleteBlob", "blobType": "BlockBlob",
              "url": "https://myegteststgfoo.blob.core.windows.net/images/old.png" }
}'),
('orders-ce', '{
    "id": "caee971c-3ca0-4254-8f99-1395b394588e",
    "source": "mysource",
    "specversion": "1.0",
    "subject": "mySubject",
    "type": "fooEventType",
    "datacontenttype": "application/json",
    "data": { "prop1": "value1", "prop2": 5 }
}');
