"""The call-overhead floor: extension methods that take the recorder's arguments and do nothing."""


cdef class NoopCore:
    def record(self, layer, selected):
        pass

    def record_prediction(self, layer, predicted):
        pass
