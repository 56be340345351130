# Written by haunt into a moto broker's directory and put on its PYTHONPATH,
# so that Python imports it at start-up, before moto's server runs.
#
# moto 5.2's SQS queue appends a sent message under the queue's lock
# (Queue.add_message) but deletes by rebuilding the message list without it
# (Queue.delete_message reads the list, filters it, and assigns the result).
# Its server answers each request on a thread of its own, so a send that
# lands while a delete is filtering is appended to the old list and then
# dropped with it: the sender was told the message was stored, and no
# receiver ever sees it. haunt's checker caught exactly that as a lost
# effect with an empty queue (docs/brokers.md). Here the delete takes the
# same lock, which makes it atomic with every send; nothing else changes.
import functools
import sys


def _delete_under_the_queue_lock():
    from moto.sqs.models import Queue

    unlocked = Queue.delete_message
    if getattr(unlocked, "haunt_locked", False):
        return

    @functools.wraps(unlocked)
    def delete_message(self, receipt_handle):
        with self._messages_lock:
            return unlocked(self, receipt_handle)

    delete_message.haunt_locked = True
    Queue.delete_message = delete_message
    sys.stderr.write("haunt: moto's SQS delete runs under the queue's lock (sitecustomize)\n")


def _receive_under_the_queue_lock():
    # A FIFO queue hands out a message group to one receive at a time. moto
    # gets that wrong twice, and haunt's order check caught both as
    # inversions on sqs:fifo:
    # - it reads which groups are in flight when a receive starts, without a
    #   lock, so two concurrent receives could both take messages of one
    #   group and apply them side by side. Under the queue's lock a receive
    #   is atomic (its long poll waits on the lock's condition, releasing it).
    # - a received batch whose visibility ran out stays "pending" until the
    #   receive loop reaches each message, so the group still looks in flight
    #   while the loop passes its first messages, and is free again only at
    #   the last: the group came back last message first. Releasing every
    #   expired receipt before the loop looks at groups gives the group back
    #   in order, as SQS does.
    from moto.sqs.models import SQSBackend

    unlocked = SQSBackend.receive_message
    if getattr(unlocked, "haunt_locked", False):
        return

    @functools.wraps(unlocked)
    def receive_message(self, queue_name, *args, **kwargs):
        queue = self.get_queue(queue_name)
        with queue._messages_lock:
            queue._pending_messages.difference_update([m for m in queue._pending_messages if m.visible])
            return unlocked(self, queue_name, *args, **kwargs)

    receive_message.haunt_locked = True
    SQSBackend.receive_message = receive_message
    sys.stderr.write("haunt: moto's SQS receive runs under the queue's lock (sitecustomize)\n")


try:
    _delete_under_the_queue_lock()
    _receive_under_the_queue_lock()
except Exception as e:  # a Python without moto, or a moto without the lock
    sys.stderr.write(f"haunt: moto's SQS delete NOT patched: {e!r}\n")
