import Common
import Testing

@Suite("AsyncBoundedQueue", .timeLimit(.minutes(3)))
struct AsyncBoundedQueueTests {
    @Test func elementsComeOutInOrder() async {
        let queue = AsyncBoundedQueue<Int>(capacity: 10)
        for value in 0..<10 { #expect(await queue.push(value)) }
        #expect(queue.size == 10)
        for value in 0..<10 { #expect(await queue.pop() == value) }
        #expect(queue.size == 0)
    }

    @Test func pushWaitsForRoomAndAPopMakesIt() async {
        let queue = AsyncBoundedQueue<Int>(capacity: 2)
        #expect(await queue.push(1))
        #expect(await queue.push(2))
        let pusher = Task { await queue.push(3) }
        // The third push cannot be in before a pop: the first pop answers 1.
        #expect(await queue.pop() == 1)
        #expect(await pusher.value)
        #expect(await queue.pop() == 2)
        #expect(await queue.pop() == 3)
    }

    @Test func weightsCountAgainstCapacityAndOfferNeverWaits() async {
        let queue = AsyncBoundedQueue<[Int]>(capacity: 10) { $0.count }
        #expect(queue.offer([1, 2, 3]) == 3)
        #expect(queue.offer(Array(0..<9)) == 12)
        #expect(queue.offer([]) == 12)
        #expect(await queue.pop() == [1, 2, 3])
        #expect(queue.size == 9)
        #expect(await queue.pop()?.count == 9)
        #expect(await queue.pop() == [])
        #expect(queue.size == 0)
    }

    @Test func finishingEndsWaitersAndLetsTheRestDrain() async {
        let queue = AsyncBoundedQueue<Int>(capacity: 1)
        #expect(await queue.push(1))
        let pusher = Task { await queue.push(2) }
        let emptyQueue = AsyncBoundedQueue<Int>(capacity: 1)
        let popper = Task { await emptyQueue.pop() }
        emptyQueue.finish()
        #expect(await popper.value == nil)
        queue.finish()
        #expect(await pusher.value == false)
        #expect(queue.offer(3) == nil)
        #expect(await queue.pop() == 1)
        #expect(await queue.pop() == nil)
        #expect(queue.isFinished)
    }

    @Test func cancelledWaitersGiveUp() async {
        let queue = AsyncBoundedQueue<Int>(capacity: 1)
        let popper = Task { await queue.pop() }
        popper.cancel()
        #expect(await popper.value == nil)
        #expect(await queue.push(1))
        let pusher = Task { await queue.push(2) }
        pusher.cancel()
        #expect(await pusher.value == false)
        #expect(await queue.pop() == 1)
        #expect(queue.size == 0)
    }
}
