# ci04: a matplotlib figure shown with plt.show(): a display result carrying a png.
import matplotlib.pyplot as plt

plt.plot([1, 2, 3], [1, 4, 9])
plt.title("e2b-bench")
plt.show()
