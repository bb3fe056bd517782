// Reads Snakemake's report (a React app) as a person would, in a headless browser: the menu, then each category's
// results, each result's view (an image decoded, or a page in a frame) and its description; back home after each.
// What each step showed is left as JSON in a pre element, id walk, for the test to read from the rendered page. The walk
// ends on the result named by WALK_LAST (its view open), for a screenshot.
(async () => {
  const walk = { menu: [], results: {}, error: null };
  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
  const root = document.querySelector("#app");
  const text = (el) => el.textContent.replace(/\s+/g, " ").trim();
  async function until(find, what) {
    for (let i = 0; i < 800; i++) {
      const found = find();
      if (found) return found;
      await sleep(25);
    }
    throw new Error("the report never showed " + what);
  }
  const menuLink = (label) => [...root.querySelectorAll("li > a")].find((a) => text(a) === label);
  const rows = () => [...root.querySelectorAll("table tbody tr")].filter((tr) => tr.querySelectorAll("a").length >= 2);
  const home = async () => {
    root.querySelector("nav ol li a").click();
    await until(() => menuLink("Workflow"), "the menu again");
  };
  // the app is a row of two: the navigation (its logo an image too), then the content
  const content = () => root.firstElementChild.lastElementChild.querySelector("img[src^='data:'], iframe[src^='data:']");
  async function view(row) {
    const before = content() && content().src;  // the view shown until this one replaces it
    row.querySelectorAll("td:last-child a")[0].click();
    const shown = await until(() => content() && content().src !== before && content(), "a result's view");
    if (shown.tagName === "IMG") {
      await until(() => shown.complete && shown.naturalWidth > 0, "the image decoded");
      return { kind: "image", type: shown.src.slice(5, shown.src.indexOf(";")), width: shown.naturalWidth };
    }
    const doc = await until(() => shown.contentDocument && shown.contentDocument.body
      && shown.contentDocument.body.textContent.trim() && shown.contentDocument, "the framed page's text");
    const shownText = doc.body.innerText.replace(/\s+/g, " ").trim();  // as laid out: table cells apart
    return { kind: "page", type: shown.src.slice(5, shown.src.indexOf(";")), text: shownText };
  }
  try {
    await until(() => menuLink("Workflow"), "its menu");
    walk.menu = [...root.querySelectorAll("li > a")].map(text).filter((label) => label);
    const categories = walk.menu.filter((label) => !["Workflow", "Statistics", "About"].includes(label));
    let last = null;
    for (const category of categories) {
      menuLink(category).click();
      const count = (await until(() => rows().length && rows(), category + "'s results")).length;
      for (let i = 0; i < count; i++) {
        const row = rows()[i];
        const name = text(row.querySelector("td"));
        const result = { category, ...(await view(row)) };
        rows()[i].querySelectorAll("td:last-child a")[1].click();
        await until(() => [...root.querySelectorAll("li, h2, h3")].some((el) => text(el) === "Description"),
          name + "'s description");
        result.info = root.innerText.replace(/\s+/g, " ").trim();
        walk.results[name] = result;
        if (name === window.WALK_LAST) last = category;
        await home();
        menuLink(category).click();
        await until(() => rows().length, category + "'s results again");
      }
      await home();
    }
    if (last !== null) {
      menuLink(last).click();
      await until(() => rows().length, "the last result's category");
      await view(rows().find((row) => text(row.querySelector("td")) === window.WALK_LAST));
    }
  } catch (err) {
    walk.error = String(err);
  }
  const out = document.createElement("pre");
  out.id = "walk";
  out.textContent = JSON.stringify(walk);
  document.body.appendChild(out);
})();
